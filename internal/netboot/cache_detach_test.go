package netboot

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// stallingOrigin serves body once release is closed; started counts requests, and aborted
// receives one value per request whose client went away before the release.
type stallingOrigin struct {
	srv     *httptest.Server
	release chan struct{}
	started chan struct{}
	aborted chan struct{}
	hits    atomic.Int64
}

func newStallingOrigin(t *testing.T, body []byte) *stallingOrigin {
	o := &stallingOrigin{release: make(chan struct{}), started: make(chan struct{}, 16), aborted: make(chan struct{}, 16)}
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.hits.Add(1)
		o.started <- struct{}{}
		select {
		case <-o.release:
			w.Write(body)
		case <-r.Context().Done():
			o.aborted <- struct{}{}
		}
	}))
	t.Cleanup(o.srv.Close)
	return o
}

func recv(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestCacheFetchOutlivesACancelledCaller: concurrent fetches of one digest share one download,
// but not the first caller's context: its cancellation ends its own wait only, and the others
// (and the download) go on.
func TestCacheFetchOutlivesACancelledCaller(t *testing.T) {
	body := []byte("the artifact bytes")
	o := newStallingOrigin(t, body)
	c := newTestCache(t, 0)
	a := Artifact{Name: "initrd.img", URL: o.srv.URL + "/initrd.img", SHA256: digest(body)}

	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	first := make(chan error, 1)
	go func() { first <- c.Fetch(ctx1, a) }()
	recv(t, o.started, "the first fetch's download")
	second := make(chan error, 1)
	go func() { second <- c.Fetch(context.Background(), a) }()
	waitWaiters(t, c, a.SHA256, 2)
	cancel1()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v, want context.Canceled", err)
	}
	close(o.release)
	select {
	case err := <-second:
		if err != nil {
			t.Fatalf("second caller (context alive) failed: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second caller still waiting")
	}
	if !c.Has(a.SHA256) || o.hits.Load() != 1 {
		t.Fatalf("held %t after %d origin requests; want held after 1", c.Has(a.SHA256), o.hits.Load())
	}
}

// TestCacheFetchCancelledWhenNobodyWaits: once every caller gave up, the download is cancelled
// (the origin sees its request end), and the next fetch starts a new one.
func TestCacheFetchCancelledWhenNobodyWaits(t *testing.T) {
	body := []byte("iso bytes")
	o := newStallingOrigin(t, body)
	c := newTestCache(t, 0)
	a := Artifact{Name: "x.iso", URL: o.srv.URL + "/x.iso", SHA256: digest(body)}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Fetch(ctx, a) }()
	recv(t, o.started, "the download")
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("fetch: %v, want context.Canceled", err)
	}
	recv(t, o.aborted, "the origin to see the download cancelled")

	close(o.release)
	if err := c.Fetch(context.Background(), a); err != nil {
		t.Fatalf("fetch after the cancelled one: %v", err)
	}
	if n := o.hits.Load(); n != 2 {
		t.Fatalf("origin hit %d times, want 2", n)
	}
	tmpEmpty(t, c)
}

// TestNewCacheSweepsPartialDownloads: what a crash left in tmp/ is removed when the cache opens;
// verified artifacts stay.
func TestNewCacheSweepsPartialDownloads(t *testing.T) {
	dir := t.TempDir()
	body := []byte("verified")
	files := map[string][]byte{
		filepath.Join("tmp", digest(body)+".123456"):        make([]byte, 4096),
		filepath.Join("tmp", digest([]byte("x"))+".999999"): []byte("partial"),
		filepath.Join("sha256", digest(body)):               body,
	}
	for p, b := range files {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), b, 0o640); err != nil {
			t.Fatal(err)
		}
	}
	c, err := NewCache(CacheConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tmpEmpty(t, c)
	if !c.Has(digest(body)) {
		t.Fatal("a verified artifact was swept")
	}
}

// waitWaiters polls until n callers wait for the download of sha.
func waitWaiters(t *testing.T, c *Cache, sha string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		f := c.flights[sha]
		got := 0
		if f != nil {
			got = f.waiters
		}
		c.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d callers wait for %s, want %d", got, sha, n)
		}
		time.Sleep(time.Millisecond)
	}
}
