package image

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/ulikunitz/xz"
)

// xzStream compresses body into one xz stream (the encoder's dictionary 64 KiB, blockSize 0
// for one block) with the given check.
func xzStream(t testing.TB, body []byte, check byte, blockSize int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	cfg := xz.WriterConfig{DictCap: 64 << 10, BlockSize: blockSize, CheckSum: check, NoCheckSum: check == xz.None}
	w, err := cfg.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(body); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// withDictCode rewrites the LZMA2 dictionary size code of the first block header of the xz
// stream at s (a stream header starts there), fixing the header's CRC32: a header that
// declares more than the data needs is valid, and the declared size is what a decoder
// allocates.
func withDictCode(t testing.TB, s []byte, code byte) []byte {
	t.Helper()
	s = bytes.Clone(s)
	h := s[12:]
	n := (int(h[0]) + 1) * 4
	if h[1] != 0 || h[2] != 0x21 || h[3] != 1 {
		t.Fatalf("unexpected block header % x (want no sizes and one LZMA2 filter)", h[:n])
	}
	h[4] = code
	binary.LittleEndian.PutUint32(h[n-4:], crc32.ChecksumIEEE(h[:n-4]))
	return s
}

func testBody(n int) []byte {
	var b []byte
	for i := 0; len(b) < n; i++ {
		b = fmt.Appendf(b, "line %d of the xz test body, %x\n", i, i*i)
	}
	return b[:n]
}

// An xz image whose blocks declare a dictionary over MaxXZDict is refused before the dictionary
// is allocated, saying the declared size, the cap and what to do, wherever the block is (the
// first stream or a later one); one at the cap decompresses.
func TestXZDictionaryBounded(t *testing.T) {
	body := testBody(100 << 10)
	small := xzStream(t, body, xz.CRC64, 0)
	for _, tc := range []struct {
		name    string
		art     []byte
		want    []byte
		wantErr string
	}{
		{"encoder's dictionary", small, body, ""},
		{"the cap (64 MiB)", withDictCode(t, small, 28), body, ""},
		{"96 MiB", withDictCode(t, small, 29), nil, "stream 1, block 1 declares a 96 MiB LZMA2 dictionary, over the 64 MiB cap"},
		{"128 MiB", withDictCode(t, small, 30), nil, "declares a 128 MiB LZMA2 dictionary, over the 64 MiB cap"},
		{"4 GiB, the largest an xz header can declare", withDictCode(t, small, 40), nil, "declares a 4294967295-byte (4096 MiB) LZMA2 dictionary, over the 64 MiB cap"},
		{"in the second stream", append(bytes.Clone(small), withDictCode(t, small, 34)...), nil, "stream 2, block 1 declares a 512 MiB LZMA2 dictionary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			r, done, err := decompressor(bytes.NewReader(tc.art), CompressionXZ)
			if err != nil {
				t.Fatal(err)
			}
			defer done()
			got, err := io.ReadAll(r)
			runtime.ReadMemStats(&after)
			if n := after.TotalAlloc - before.TotalAlloc; n > MaxXZDict+16*mib {
				t.Errorf("decoding allocated %d MiB", n>>20)
			}
			switch {
			case tc.wantErr == "" && (err != nil || !bytes.Equal(got, tc.want)):
				t.Fatalf("decompressed %d bytes, %v; want the %d bytes", len(got), err, len(tc.want))
			case tc.wantErr != "" && (!errors.Is(err, ErrXZDictTooLarge) || !strings.Contains(err.Error(), tc.wantErr) ||
				!strings.Contains(err.Error(), "--lzma2=dict=64MiB or less")):
				t.Fatalf("error %v, want ErrXZDictTooLarge saying %q and what to do", err, tc.wantErr)
			}
		})
	}
	t.Run("through Write", func(t *testing.T) {
		art := withDictCode(t, xzStream(t, diskImage(64<<10, 5), xz.CRC32, 0), 40)
		target := newMemTarget(4 * mib)
		_, err := Write(context.Background(), testLog(), bytes.NewReader(art), Spec{Compression: CompressionXZ, SHA256: sha256Hex(art)}, target, Options{}, nil)
		if !errors.Is(err, ErrXZDictTooLarge) {
			t.Fatalf("err = %v, want ErrXZDictTooLarge", err)
		}
		if bytes.ContainsFunc(target.b[:mib], func(r rune) bool { return r != 0 }) {
			t.Error("the disk's first MiB is not zeroed after the refusal")
		}
	})
}

// The container parser decodes what xz.Reader decodes: every check type, many blocks, several
// streams with stream padding between and after them, empty streams, and the xz tool's own
// multi-threaded output (compressed and uncompressed sizes in the block headers).
func TestXZReaderDecodes(t *testing.T) {
	body := testBody(100 << 10)
	pad := make([]byte, 8)
	cliBody := func() []byte { // what testdata/blocks.xz holds (xz -T2 --block-size=8KiB --check=crc32)
		var b []byte
		for i := range 2000 {
			b = fmt.Appendf(b, "line %d of the xz fixture\n", i)
		}
		return b
	}
	cli, err := os.ReadFile(filepath.Join("testdata", "blocks.xz"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		art  []byte
		want []byte
	}{
		{"no check", xzStream(t, body, xz.None, 0), body},
		{"CRC32", xzStream(t, body, xz.CRC32, 0), body},
		{"CRC64", xzStream(t, body, xz.CRC64, 0), body},
		{"SHA-256", xzStream(t, body, xz.SHA256, 0), body},
		{"many blocks", xzStream(t, body, xz.CRC64, 10<<10), body},
		{"empty stream", xzStream(t, nil, xz.CRC64, 0), nil},
		{"streams and padding", bytes.Join([][]byte{
			xzStream(t, body[:1000], xz.CRC32, 0), pad, xzStream(t, nil, xz.None, 0),
			xzStream(t, body[1000:], xz.SHA256, 32<<10), pad[:4]}, nil), body},
		{"xz tool, sizes in block headers", cli, cliBody()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x, err := newXZReader(bytes.NewReader(tt.art))
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(x)
			if err != nil || !bytes.Equal(got, tt.want) {
				t.Fatalf("decoded %d bytes, %v; want %d bytes", len(got), err, len(tt.want))
			}
			lib, err := xz.NewReader(bytes.NewReader(tt.art))
			if err != nil {
				t.Fatal(err)
			}
			if ref, err := io.ReadAll(lib); err != nil || !bytes.Equal(ref, got) {
				t.Fatalf("xz.Reader decodes %d bytes, %v", len(ref), err)
			}
		})
	}
}

// A truncated or altered xz image is an error, never a short or different image: every prefix
// of a stream (two blocks, stream padding) fails, and so does every single-byte change of it
// except those the LZMA2 decoder ignores (a chunk that declares more packed bytes than its
// data takes: the decoder reads on where the data ended), which decode the same image.
func TestXZReaderRejectsDamage(t *testing.T) {
	body := testBody(3000)
	art := append(xzStream(t, body, xz.CRC64, 2000), 0, 0, 0, 0)
	decode := func(b []byte) ([]byte, error) {
		x, err := newXZReader(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		return io.ReadAll(x)
	}
	if got, err := decode(art); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("intact: %d bytes, %v", len(got), err)
	}
	for n := range len(art) - 4 {
		if _, err := decode(art[:n]); err == nil {
			t.Errorf("truncated to %d of %d bytes: no error", n, len(art))
		}
	}
	for i := range len(art) {
		for _, flip := range []byte{0x01, 0x80} {
			b := bytes.Clone(art)
			b[i] ^= flip
			if got, err := decode(b); err == nil && !bytes.Equal(got, body) {
				t.Errorf("byte %d ^ %#x: decoded %d different bytes without error", i, flip, len(got))
			}
		}
	}
	for _, tc := range []struct {
		name string
		art  []byte
		want string
	}{
		{"not xz", []byte("plain text, not an xz file"), "not an xz file"},
		{"empty", nil, "unexpected EOF"},
		{"garbage after a stream", append(bytes.Clone(art), "trailing garbage, not a stream"...), "no xz magic after stream 1"},
		{"partial padding", append(bytes.Clone(art), 0, 0), "unexpected EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decode(tc.art); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// Whatever the input, the container parser ends without panicking, and never decodes what
// xz.Reader rejects or decodes differently (it is called only when ours succeeded, so never on
// a dictionary over the cap).
func FuzzXZReader(f *testing.F) {
	body := testBody(5000)
	f.Add(xzStream(f, body, xz.CRC64, 1500))
	f.Add(xzStream(f, body, xz.None, 0))
	f.Add(append(xzStream(f, body[:10], xz.SHA256, 0), 0, 0, 0, 0))
	if cli, err := os.ReadFile(filepath.Join("testdata", "blocks.xz")); err == nil {
		f.Add(cli)
	}
	f.Fuzz(func(t *testing.T, art []byte) {
		x, err := newXZReader(bytes.NewReader(art))
		if err != nil {
			return
		}
		got, err := io.ReadAll(io.LimitReader(x, 1<<20))
		if err != nil || len(got) == 1<<20 {
			return
		}
		lib, err := xz.NewReader(bytes.NewReader(art))
		if err != nil {
			t.Fatalf("ours decoded %d bytes, xz.NewReader: %v", len(got), err)
		}
		ref, err := io.ReadAll(lib)
		if err != nil || !bytes.Equal(ref, got) {
			t.Fatalf("ours decoded %d bytes, xz.Reader %d: %v", len(got), len(ref), err)
		}
	})
}
