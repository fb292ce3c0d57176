package site_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"bcd/internal/netboot"
	"bcd/internal/site"
)

// rawGet sends a GET on c and reads its answer.
func rawGet(t *testing.T, c net.Conn, br *bufio.Reader, path string) (*http.Response, error) {
	t.Helper()
	if _, err := io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return nil, err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, nil
}

// closedWithin reads c until the server closes it; it fails when that takes longer than d.
func closedWithin(t *testing.T, c net.Conn, d time.Duration) (read int64) {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(d)); err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after %s (%d bytes read)", d, n)
	}
	return n
}

// cachedArtifact puts an artifact of size random bytes into a new cache.
func cachedArtifact(t *testing.T, size int) (*netboot.Cache, netboot.Artifact) {
	t.Helper()
	body := make([]byte, size)
	rand.Read(body)
	sum := sha256.Sum256(body)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write(body) }))
	defer origin.Close()
	c, err := netboot.NewCache(netboot.CacheConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	art := netboot.Artifact{Name: "big.img", URL: origin.URL + "/big.img", SHA256: hex.EncodeToString(sum[:])}
	if err := c.Fetch(context.Background(), art); err != nil {
		t.Fatal(err)
	}
	return c, art
}

// TestBootHTTPBounds: the boot HTTP server, which anyone on the provisioning network reaches,
// closes idle keep-alive connections, drops a request whose body does not arrive in time and a
// download nobody reads, and holds no more connections than its bound; a download that reads
// completes whatever its length.
func TestBootHTTPBounds(t *testing.T) {
	const short = 300 * time.Millisecond
	cache, art := cachedArtifact(t, 32<<20) // more than loopback's socket buffers hold
	artPath := netboot.ArtifactPath + art.SHA256 + "/" + art.Name
	tests := []struct {
		name string
		cfg  func(*site.Config)
		run  func(t *testing.T, addr string)
	}{
		{"idle keep-alive closed", func(c *site.Config) { c.HTTPIdleTimeout = short }, func(t *testing.T, addr string) {
			c := dial(t, addr)
			if _, err := rawGet(t, c, bufio.NewReader(c), netboot.MetadataPath); err != nil {
				t.Fatal(err)
			}
			closedWithin(t, c, 10*short)
		}},
		{"slow body dropped", func(c *site.Config) { c.HTTPBodyTimeout = short; c.DiscoveryBoot = true }, func(t *testing.T, addr string) {
			c := dial(t, addr)
			if _, err := io.WriteString(c, "POST "+netboot.DiscoveryPath+" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n{"); err != nil {
				t.Fatal(err)
			}
			// The body never completes: the server answers (400) and closes well before the
			// header timeout (10 s) would have.
			closedWithin(t, c, 10*short)
		}},
		{"stalled download dropped", func(c *site.Config) { c.HTTPWriteTimeout = short; c.HTTPMaxConns = 1 }, func(t *testing.T, addr string) {
			// A client asks for the artifact and reads nothing. It holds the one connection
			// the server allows until its write times out; then the server closes it, and
			// serves the next connection.
			stalled := dial(t, addr)
			if tc, ok := stalled.(*net.TCPConn); ok {
				_ = tc.SetReadBuffer(4096)
			}
			if _, err := io.WriteString(stalled, "GET "+artPath+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			next := dial(t, addr)
			next.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := rawGet(t, next, bufio.NewReader(next), netboot.MetadataPath); err != nil {
				t.Fatalf("the next connection was not served while a download stalled: %v", err)
			}
		}},
		{"download that reads completes", func(c *site.Config) { c.HTTPWriteTimeout = short }, func(t *testing.T, addr string) {
			resp, err := http.Get("http://" + addr + artPath)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			h := sha256.New()
			n, err := io.Copy(h, resp.Body)
			if err != nil || hex.EncodeToString(h.Sum(nil)) != art.SHA256 {
				t.Fatalf("download: %d bytes, %v; digest matches: %t", n, err, hex.EncodeToString(h.Sum(nil)) == art.SHA256)
			}
		}},
		{"connections bounded", func(c *site.Config) { c.HTTPMaxConns = 2 }, func(t *testing.T, addr string) {
			var held []net.Conn
			for range 2 {
				c := dial(t, addr)
				if _, err := rawGet(t, c, bufio.NewReader(c), netboot.MetadataPath); err != nil {
					t.Fatal(err)
				}
				held = append(held, c)
			}
			// A third connection is not served while two are open...
			third := dial(t, addr)
			br := bufio.NewReader(third)
			third.SetReadDeadline(time.Now().Add(short))
			if _, err := rawGet(t, third, br, netboot.MetadataPath); err == nil {
				t.Fatal("a third connection was served while the bound of 2 was reached")
			}
			// ...and is once one of them closes.
			held[0].Close()
			third.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("third connection after one closed: %v", err)
			}
			resp.Body.Close()
		}},
		{"discovery reports refused without discovery boot", nil, func(t *testing.T, addr string) {
			resp, err := http.Post("http://"+addr+netboot.DiscoveryPath, "application/json", strings.NewReader(`{"bootMac":"02:00:00:00:00:01"}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Fatalf("discovery report: %d, want 404", resp.StatusCode)
			}
		}},
	}
	env := startGateway(t)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs syncBuffer
			id := "h" + string(rune('a'+i))
			cfg := agentConfig(t, env, id, t.TempDir(), logger(t, &logs))
			cfg.ArtifactCache = cache
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			ag := startAgent(t, cfg, id)
			tt.run(t, ag.HTTPAddr().String())
		})
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
