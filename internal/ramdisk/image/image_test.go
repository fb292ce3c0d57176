package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"bcd/internal/ramdisk/wipe"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

func testLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// diskImage is a fake disk image: an MBR signature, random data, and runs of zeros.
func diskImage(size int, seed uint64) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(seed, 2))
	for i := 0; i+8 <= size; i += 8 {
		if (i/(256<<10))%3 == 1 {
			continue // zero runs, like real images
		}
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	if size >= 512 {
		b[510], b[511] = 0x55, 0xaa
	}
	return b
}

func compress(t testing.TB, c Compression, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.WriteCloser
	var err error
	switch c {
	case CompressionNone:
		return data
	case CompressionZstd:
		w, err = zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedFastest))
	case CompressionGzip:
		w = gzip.NewWriter(&buf)
	case CompressionXZ:
		w, err = xz.NewWriter(&buf)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sha256Hex(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
func sha512Hex(b []byte) string { s := sha512.Sum512(b); return hex.EncodeToString(s[:]) }

// fileTarget is a target file pre-filled with 0xff, so every byte the image should zero is checked.
type fileTarget struct {
	*os.File
	size int64
}

func (f fileTarget) Size() int64 { return f.size }

func newTarget(t testing.TB, size int) fileTarget {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(path, bytes.Repeat([]byte{0xff}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return fileTarget{f, int64(size)}
}

func (f fileTarget) bytes(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func serve(t testing.TB, body []byte) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "img", time.Time{}, bytes.NewReader(body))
	}))
	t.Cleanup(s.Close)
	if !strings.HasPrefix(s.URL, "http://127.0.0.1:") {
		t.Fatalf("test server not on loopback: %s", s.URL)
	}
	return s
}

func TestFetchFormats(t *testing.T) {
	sizes := []int{3*mib + 123, 12 * mib, 700 << 10}
	for _, size := range sizes {
		img := diskImage(size, uint64(size))
		for _, c := range []Compression{CompressionNone, CompressionZstd, CompressionGzip, CompressionXZ} {
			if c == CompressionXZ && size > mib {
				continue // the pure-Go xz encoder is slow under -race; the small size covers it
			}
			art := compress(t, c, img)
			for _, alg := range []string{"sha256", "sha512"} {
				t.Run(strconv.Itoa(size)+"/"+string(c)+"/"+alg, func(t *testing.T) {
					spec := Spec{URL: serve(t, art).URL + "/img", Compression: c, Size: int64(size)}
					if alg == "sha256" {
						spec.SHA256 = sha256Hex(art)
					} else {
						spec.SHA512 = strings.ToUpper(sha512Hex(art))
					}
					target := newTarget(t, size+5*mib)
					var last int64
					res, err := Fetch(context.Background(), testLog(), spec, target, Options{ChunkSize: 2 * mib}, func(stage Stage, w, total int64, rate float64) {
						if stage != Writing || w < last || total != int64(size) || rate <= 0 {
							t.Errorf("progress %d/%d at %f after %d", w, total, rate, last)
						}
						last = w
					})
					if err != nil {
						t.Fatalf("Fetch: %v", err)
					}
					got := target.bytes(t)
					if !bytes.Equal(got[:size], img) {
						t.Fatal("target differs from the image")
					}
					if got[size] != 0xff && size >= mib {
						t.Error("wrote past the image")
					}
					if res.BytesWritten != int64(size) || res.BytesRead != int64(len(art)) || last != int64(size) || res.Algorithm != alg {
						t.Errorf("result %+v, progress %d", res, last)
					}
				})
			}
		}
	}
}

func TestWriteThroughBlockDevice(t *testing.T) {
	// The ramdisk's real target type, over a file: O_DIRECT for aligned writes.
	img := diskImage(9*mib+4096+77, 5)
	art := compress(t, CompressionZstd, img)
	path := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(path, bytes.Repeat([]byte{0xee}, 16*mib), 0o600); err != nil {
		t.Fatal(err)
	}
	dev, err := wipe.Open(path, wipe.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Write(context.Background(), testLog(), bytes.NewReader(art), Spec{Compression: CompressionZstd, SHA256: sha256Hex(art)}, dev, Options{}, nil)
	if cerr := dev.Close(); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if !bytes.Equal(got[:len(img)], img) {
		t.Fatal("target differs")
	}
}

func TestWriteFailuresLeaveDiskUnbootable(t *testing.T) {
	img := diskImage(4*mib, 7)
	good := compress(t, CompressionZstd, img)
	truncated := good[:len(good)/2]
	tests := []struct {
		name    string
		src     []byte
		spec    Spec
		target  int
		wantErr string
		is      error
	}{
		{"digest mismatch raw", img, Spec{SHA256: sha256Hex(append([]byte{1}, img...))}, 8 * mib, "digest mismatch", ErrDigestMismatch},
		{"digest mismatch zstd", good, Spec{Compression: CompressionZstd, SHA512: sha512Hex(img)}, 8 * mib, "digest mismatch", ErrDigestMismatch},
		{"truncated zstd", truncated, Spec{Compression: CompressionZstd, SHA256: sha256Hex(truncated)}, 8 * mib, "reading the image stream", nil},
		{"truncated raw (digest of the full image)", img[:3*mib], Spec{SHA256: sha256Hex(img)}, 8 * mib, "digest mismatch", ErrDigestMismatch},
		{"size mismatch", img, Spec{SHA256: sha256Hex(img), Size: 5 * mib}, 8 * mib, "spec says", nil},
		{"larger than the target (streaming)", img, Spec{SHA256: sha256Hex(img)}, 3 * mib, "larger than", nil},
		{"corrupt gzip", img, Spec{Compression: CompressionGzip, SHA256: sha256Hex(img)}, 8 * mib, "gzip", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := newTarget(t, tt.target)
			_, err := Write(context.Background(), testLog(), bytes.NewReader(tt.src), tt.spec, target, Options{ChunkSize: mib}, nil)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("err %v is not %v", err, tt.is)
			}
			got := target.bytes(t)
			if bytes.ContainsFunc(got[:mib], func(r rune) bool { return r != 0 }) {
				t.Error("first MiB not zeroed after a failed write")
			}
		})
	}
}

func TestSpecRefused(t *testing.T) {
	d := sha256Hex(nil)
	tests := []struct {
		name string
		spec Spec
	}{
		{"no digest", Spec{}},
		{"both digests", Spec{SHA256: d, SHA512: sha512Hex(nil)}},
		{"short digest", Spec{SHA256: d[:10]}},
		{"sha512 length in sha256", Spec{SHA256: sha512Hex(nil)}},
		{"not hex", Spec{SHA256: strings.Repeat("zz", 32)}},
		{"unknown format", Spec{SHA256: d, Format: "vmdk"}},
		{"unknown compression", Spec{SHA256: d, Compression: "lz4"}},
		{"negative size", Spec{SHA256: d, Size: -1}},
		{"does not fit", Spec{SHA256: d, Size: 1 << 40}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target := newTarget(t, 2*mib)
			if _, err := Write(context.Background(), testLog(), bytes.NewReader(nil), tt.spec, target, Options{}, nil); err == nil {
				t.Fatal("want error")
			}
			if got := target.bytes(t); got[0] != 0xff {
				t.Error("a refused spec touched the disk")
			}
		})
	}
}

func TestFetchHTTPErrors(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/short":
			w.Header().Set("Content-Length", strconv.Itoa(4*mib))
			w.Write(diskImage(mib, 1)) // the server closes the connection early
		default:
			http.NotFound(w, r)
		}
	}))
	defer s.Close()
	for _, path := range []string{"/missing", "/short"} {
		t.Run(path, func(t *testing.T) {
			target := newTarget(t, 8*mib)
			_, err := Fetch(context.Background(), testLog(), Spec{URL: s.URL + path, SHA256: sha256Hex(diskImage(4*mib, 1))}, target, Options{}, nil)
			if err == nil {
				t.Fatal("want error")
			}
			t.Log(err)
			if got := target.bytes(t); bytes.ContainsFunc(got[:mib], func(r rune) bool { return r != 0 }) && path != "/missing" {
				t.Error("first MiB not zeroed")
			}
		})
	}
}

func TestWriteCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	img := diskImage(4*mib, 3)
	target := newTarget(t, 8*mib)
	if _, err := Write(ctx, testLog(), bytes.NewReader(img), Spec{SHA256: sha256Hex(img)}, target, Options{}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}
