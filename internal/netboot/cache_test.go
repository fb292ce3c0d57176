package netboot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func digest(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// origin is a loopback HTTP server handing out fixed bodies and counting requests.
type origin struct {
	srv    *httptest.Server
	hits   atomic.Int64
	bodies map[string][]byte
	gate   chan struct{} // when non-nil, every response waits for it to close
}

func newOrigin(t *testing.T, bodies map[string][]byte) *origin {
	o := &origin{bodies: bodies}
	o.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.hits.Add(1)
		if o.gate != nil {
			<-o.gate
		}
		b, ok := o.bodies[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b)
	}))
	t.Cleanup(o.srv.Close)
	return o
}

func newTestCache(t *testing.T, max int64) *Cache {
	c, err := NewCache(CacheConfig{Dir: t.TempDir(), MaxBytes: max})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func tmpEmpty(t *testing.T, c *Cache) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(c.dir, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("tmp dir holds %d leftovers", len(ents))
	}
}

func TestCacheFetch(t *testing.T) {
	good := []byte(strings.Repeat("kernel-bytes ", 1000))
	o := newOrigin(t, map[string][]byte{"/k": good, "/big": make([]byte, 2048)})
	ctx := context.Background()
	tests := []struct {
		name    string
		art     Artifact
		max     int64
		wantErr string
	}{
		{"match", Artifact{Name: "vmlinuz", URL: o.srv.URL + "/k", SHA256: digest(good)}, 0, ""},
		{"mismatch", Artifact{Name: "vmlinuz", URL: o.srv.URL + "/k", SHA256: digest([]byte("other"))}, 0, "sha256 mismatch"},
		{"404", Artifact{Name: "vmlinuz", URL: o.srv.URL + "/missing?sig=SECRETSIG", SHA256: digest(good)}, 0, "HTTP status 404"},
		{"too big", Artifact{Name: "big", URL: o.srv.URL + "/big", SHA256: digest(make([]byte, 2048))}, 1024, "larger than"},
		{"refused scheme", Artifact{Name: "x", URL: "file:///etc/passwd", SHA256: digest(good)}, 0, "only http and https"},
		{"unreachable", Artifact{Name: "x", URL: "http://127.0.0.1:1/x?token=SECRETSIG", SHA256: digest(good)}, 0, "127.0.0.1:1/x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newTestCache(t, tt.max)
			err := c.Fetch(ctx, tt.art)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !c.Has(tt.art.SHA256) {
					t.Fatal("fetched artifact not held")
				}
				f, err := c.Open(tt.art.SHA256)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(f)
				f.Close()
				if string(b) != string(good) {
					t.Fatal("content differs")
				}
			} else {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "SECRETSIG") {
					t.Fatalf("error leaks the URL query: %v", err)
				}
				if c.Has(tt.art.SHA256) {
					t.Fatal("refused artifact is held")
				}
			}
			tmpEmpty(t, c)
		})
	}
}

func TestCacheConcurrentFetchSharesDownload(t *testing.T) {
	body := []byte("initrd contents")
	o := newOrigin(t, map[string][]byte{"/i": body})
	o.gate = make(chan struct{})
	c := newTestCache(t, 0)
	a := Artifact{Name: "initrd", URL: o.srv.URL + "/i", SHA256: digest(body)}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- c.Fetch(context.Background(), a) })
	}
	// Release the origin once the first request arrived; the others are waiting on the flight.
	for o.hits.Load() == 0 {
		runtimeGosched()
	}
	close(o.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := o.hits.Load(); n != 1 {
		t.Fatalf("origin hit %d times, want 1", n)
	}
	if err := c.Fetch(context.Background(), a); err != nil || o.hits.Load() != 1 {
		t.Fatalf("refetch of a held artifact: err %v, hits %d", err, o.hits.Load())
	}
}

func TestCacheServeRange(t *testing.T) {
	body := []byte("0123456789abcdefghij")
	o := newOrigin(t, map[string][]byte{"/iso": body})
	c := newTestCache(t, 0)
	a := Artifact{Name: "x.iso", URL: o.srv.URL + "/iso", SHA256: digest(body)}
	tests := []struct {
		rangeHdr string
		status   int
		want     string
	}{
		{"", 200, string(body)},
		{"bytes=0-3", 206, "0123"},
		{"bytes=10-", 206, "abcdefghij"},
		{"bytes=-2", 206, "ij"},
		{"bytes=100-200", 416, ""},
	}
	check := func(held bool) {
		for _, tt := range tests {
			req := httptest.NewRequest("GET", "/artifacts/"+a.SHA256+"/x.iso", nil)
			if tt.rangeHdr != "" {
				req.Header.Set("Range", tt.rangeHdr)
			}
			rec := httptest.NewRecorder()
			c.ServeArtifact(rec, req, a.SHA256)
			if !held {
				if rec.Code != 404 {
					t.Fatalf("unheld artifact: status %d, want 404", rec.Code)
				}
				continue
			}
			if rec.Code != tt.status {
				t.Fatalf("range %q: status %d, want %d", tt.rangeHdr, rec.Code, tt.status)
			}
			if tt.status != 416 && rec.Body.String() != tt.want {
				t.Fatalf("range %q: body %q, want %q", tt.rangeHdr, rec.Body.String(), tt.want)
			}
		}
	}
	check(false)
	if err := c.Fetch(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	check(true)
}

func runtimeGosched() { runtime.Gosched() }
