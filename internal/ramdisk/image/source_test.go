package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// recTarget records the order of writes and syncs.
type recTarget struct {
	mu  sync.Mutex
	ops []string
}

func (r *recTarget) Size() int64 { return 64 * mib }
func (r *recTarget) WriteAt(p []byte, off int64) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, fmt.Sprintf("write@%d", off))
	return len(p), nil
}
func (r *recTarget) Sync() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, "sync")
	return nil
}

// The zeroed first MiB is made durable before any (unverified) image byte is written, and the
// image's own first MiB is written last, after the digest matched, then synced; a failed write
// zeroes the first and last MiB again and syncs that.
func TestHeadZeroSyncedBeforeBody(t *testing.T) {
	img := diskImage(4*mib, 1)
	tests := []struct {
		name   string
		digest string
		want   []string
	}{
		{"verified", sha256Hex(img), []string{"write@0", "write@66060288", "sync", "write@1048576", "write@0", "sync"}},
		{"digest mismatch", strings.Repeat("0", 64), []string{"write@0", "write@66060288", "sync", "write@1048576", "write@0", "write@66060288", "sync"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tg := &recTarget{}
			_, err := Write(context.Background(), testLog(), bytes.NewReader(img), Spec{SHA256: tt.digest}, tg, Options{}, nil)
			if (err == nil) != (tt.name == "verified") {
				t.Fatalf("err = %v", err)
			}
			if strings.Join(tg.ops, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("ops %v, want %v", tg.ops, tt.want)
			}
		})
	}
}

// qcow2 staging (in the ramdisk's RAM, before the digest can be checked) stops at the image's
// size plus room for qcow2 tables, and never goes past the target's size: a decompression bomb
// fails at once with a clear error instead of filling the tmpfs.
func TestQCOW2StagingBounded(t *testing.T) {
	bomb := compress(t, CompressionZstd, make([]byte, 96*mib)) // 96 MiB of zeros, a few KiB
	srv := serve(t, bomb)
	tests := []struct {
		name      string
		specSize  int64
		target    int
		wantLimit int64
	}{
		{"bounded by the spec's size", 2 * mib, 8 * mib, 2*mib + 2*mib/32 + 32*mib},
		{"no size in the spec: bounded by the target", 0, 3 * mib, 3*mib + 3*mib/32 + 32*mib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			_, err := Fetch(context.Background(), testLog(), Spec{URL: srv.URL, Format: FormatQCOW2, Compression: CompressionZstd,
				SHA256: sha256Hex(bomb), Size: tt.specSize}, newTarget(t, tt.target), Options{TempDir: dir}, nil)
			want := fmt.Sprintf("unpacks to more than %d bytes", tt.wantLimit)
			if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "refusing to stage") {
				t.Fatalf("err = %v, want %q", err, want)
			}
			if left, _ := os.ReadDir(dir); len(left) != 0 {
				t.Errorf("staging files left behind: %v", left)
			}
		})
	}
	if _, limit := qcow2StagingLimit(1<<40, 1<<30); limit != 1<<30+1<<30/32+32*mib {
		t.Errorf("a spec larger than the target is bounded by the target: limit %d", limit)
	}
}

// stallServer serves paths that stall: /headers never answers, /body sends 1 MiB of a 4 MiB
// body and stops, /steady sends 4 MiB in slices at an even pace. Handlers return when the test
// ends.
func stallServer(t *testing.T, body []byte) *httptest.Server {
	t.Helper()
	release := make(chan struct{})
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/headers":
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/body":
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.Write(body[:mib])
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
		case "/steady":
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for off := 0; off < len(body); off += 256 << 10 {
				<-tick.C
				w.Write(body[off:min(off+256<<10, len(body))])
				w.(http.Flusher).Flush()
			}
		}
	}))
	t.Cleanup(func() { close(release); s.Close() })
	return s
}

// A source that stops sending fails the download after the idle timeout, not at the command's
// deadline; a slow but steady one does not.
func TestFetchIdleTimeout(t *testing.T) {
	img := diskImage(4*mib, 5)
	srv := stallServer(t, img)
	tests := []struct {
		path    string
		idle    time.Duration
		stalled bool
	}{
		{"/headers", 200 * time.Millisecond, true},
		{"/body", 200 * time.Millisecond, true},
		{"/steady", 3 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			target := newTarget(t, 8*mib)
			start := time.Now()
			_, err := Fetch(ctx, testLog(), Spec{URL: srv.URL + tt.path, SHA256: sha256Hex(img)}, target, Options{IdleTimeout: tt.idle}, nil)
			took := time.Since(start)
			if !tt.stalled {
				if err != nil {
					t.Fatalf("steady source failed: %v", err)
				}
				if !bytes.Equal(target.bytes(t)[:len(img)], img) {
					t.Fatal("image not written")
				}
				return
			}
			if !errors.Is(err, ErrSourceStalled) || !strings.Contains(err.Error(), "sent nothing for "+tt.idle.String()) {
				t.Fatalf("err = %v, want %v", err, ErrSourceStalled)
			}
			t.Log(err)
			if took > 20*time.Second {
				t.Errorf("took %v to notice the stall", took)
			}
			got := target.bytes(t)
			switch {
			case tt.path == "/headers" && bytes.Count(got, []byte{0xff}) != len(got):
				t.Error("the target was written to though no response came")
			case tt.path == "/body" && bytes.Count(got[:mib], []byte{0}) != mib:
				t.Error("first MiB not zeroed after the stall")
			}
		})
	}
}

// slowTarget takes longer than the idle timeout for its first body write: time spent writing
// to the disk is not the source's idleness.
type slowTarget struct {
	fileTarget
	once  sync.Once
	delay time.Duration
}

func (s *slowTarget) WriteAt(p []byte, off int64) (int, error) {
	if off > 0 {
		s.once.Do(func() { <-time.After(s.delay) })
	}
	return s.fileTarget.WriteAt(p, off)
}

func TestFetchIdleTimeoutIgnoresDiskTime(t *testing.T) {
	img := diskImage(12*mib, 6)
	srv := serve(t, img)
	// The disk takes three idle timeouts per write; the timeout itself is long enough that a
	// loaded machine (the race detector, parallel packages) does not starve the local source
	// for that long (150 ms did, now and then).
	target := &slowTarget{fileTarget: newTarget(t, 16*mib), delay: 3 * time.Second}
	_, err := Fetch(context.Background(), testLog(), Spec{URL: srv.URL, SHA256: sha256Hex(img)}, target,
		Options{IdleTimeout: time.Second, ChunkSize: mib, Buffers: 2}, nil)
	if err != nil {
		t.Fatalf("a slow disk was taken for a stalled source: %v", err)
	}
}

// failingTarget fails every write between from and to (the disk dies under the image), while
// the zeroing of its ends succeeds.
type failingTarget struct {
	*memTarget
	from, to int64
}

func (f failingTarget) WriteAt(p []byte, off int64) (int, error) {
	if off >= f.from && off < f.to {
		return 0, errors.New("input/output error")
	}
	return f.memTarget.WriteAt(p, off)
}

// A disk that fails during the write fails the deploy at once, with the disk's error: the read
// that waits for the source (slow, or stalled as here: a decompressor that cannot fill the next
// chunk) is ended, instead of holding the command until the idle timeout and then reporting
// the source as stalled.
func TestFetchDiskFailureEndsTheDownload(t *testing.T) {
	const idle = 45 * time.Second
	for _, c := range []Compression{CompressionNone, CompressionGzip, CompressionZstd} {
		t.Run(string(c), func(t *testing.T) {
			img := diskImage(24*mib, 5)
			art := compress(t, c, img)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Write(art[:len(art)*2/3]) // then nothing, the connection open
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			}))
			t.Cleanup(srv.Close)
			target := failingTarget{newMemTarget(32 * mib), mib, 31 * mib}
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := Fetch(context.Background(), testLog(), Spec{URL: srv.URL, Compression: c, SHA256: sha256Hex(art)}, target,
					Options{IdleTimeout: idle, ChunkSize: mib}, nil)
				done <- err
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(2 * idle):
				t.Fatal("Fetch did not return")
			}
			if err == nil || !strings.Contains(err.Error(), "input/output error") || errors.Is(err, ErrSourceStalled) {
				t.Fatalf("err = %v, want the disk's error", err)
			}
			if d := time.Since(start); d >= idle {
				t.Errorf("returned after %v: the failed disk waited for the stalled source", d)
			}
			if bytes.ContainsFunc(target.b[:mib], func(r rune) bool { return r != 0 }) {
				t.Error("first MiB not zeroed after the failure")
			}
		})
	}
}
