package site

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
)

// TestPushedArtifactsRetried: a new boot-lease holder caches the artifacts of the entries it is
// pushed in the background. An origin that fails at first is asked again, with backoff, until
// the artifact is cached; once no entry boots the artifact any more, the agent stops asking.
func TestPushedArtifactsRetried(t *testing.T) {
	tests := []struct {
		name       string
		failures   int32 // the origin's first answers are 503
		removeWhen int32 // after this many requests the entry is removed (0: never)
		wantCached bool
	}{
		{"origin fails once", 2, 0, true},
		{"origin fails several times", 6, 0, true},
		{"entry removed while the origin fails", 1 << 30, 4, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := map[string][]byte{"/vmlinuz": []byte("kernel"), "/initrd": []byte("initrd")}
			var reqs atomic.Int32
			removed := make(chan struct{})
			var a *Agent
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := reqs.Add(1)
				if n == tt.removeWhen {
					if err := a.entries.Sync(true, nil); err != nil {
						t.Error(err)
					}
					close(removed)
				}
				if n <= tt.failures {
					http.Error(w, "busy", http.StatusServiceUnavailable)
					return
				}
				w.Write(files[r.URL.Path])
			}))
			defer srv.Close()
			sum := func(p string) string { s := sha256.Sum256(files[p]); return hex.EncodeToString(s[:]) }
			rd := RamdiskConfig{GatewayURL: "https://gw:7443",
				Kernel: netboot.Artifact{Name: "vmlinuz", URL: srv.URL + "/vmlinuz", SHA256: sum("/vmlinuz")},
				Initrd: netboot.Artifact{Name: "initrd", URL: srv.URL + "/initrd", SHA256: sum("/initrd")}}
			e, err := OpenEntries(t.TempDir(), "https://gw", nil)
			if err != nil {
				t.Fatal(err)
			}
			c, err := netboot.NewCache(netboot.CacheConfig{Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			a = &Agent{cfg: Config{Ramdisk: rd}, entries: e, cache: c, log: slog.New(slog.DiscardHandler), dirty: make(chan struct{}, 1),
				fetchRetry: 5 * time.Millisecond}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			es := []agentlink.BootEntry{{NodeID: "n1", Kind: "ramdisk", MACs: []string{"52:54:00:00:00:01"}, Token: "bcdd_one_0123456789abcdef"}}
			if err := a.applyPushed(ctx, true, es); err != nil {
				t.Fatal(err)
			}
			a.bg.Wait() // the retry loops end: cached, or no longer needed
			if ctx.Err() != nil {
				t.Fatalf("the retries outlasted the test's deadline (%d origin requests)", reqs.Load())
			}
			cached := c.Has(rd.Kernel.SHA256) && c.Has(rd.Initrd.SHA256)
			if cached != tt.wantCached {
				t.Errorf("after %d origin requests: cached %t, want %t", reqs.Load(), cached, tt.wantCached)
			}
			if tt.removeWhen > 0 {
				<-removed
			}
			t.Logf("%d origin requests", reqs.Load())
		})
	}
}
