package netboot

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeEntries map[string]Entry

func (f fakeEntries) Entry(_ context.Context, mac net.HardwareAddr) (Entry, bool) {
	e, ok := f[mac.String()]
	return e, ok
}

type fakeDiscovery struct {
	mu   sync.Mutex
	seen []Discovery
}

func (f *fakeDiscovery) RecordDiscovery(_ context.Context, d Discovery) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = append(f.seen, d)
	return nil
}

type fakeArtifacts map[string]bool

func (f fakeArtifacts) Has(sha string) bool { return f[sha] }
func (f fakeArtifacts) ServeArtifact(w http.ResponseWriter, _ *http.Request, sha string) {
	if !f[sha] {
		http.NotFound(w, nil)
		return
	}
	w.Write([]byte("artifact " + sha))
}

type fakeMetadata map[netip.Addr]string

func (f fakeMetadata) Metadata(_ context.Context, a netip.Addr) ([]byte, bool) {
	d, ok := f[a]
	return []byte(d), ok
}

var fixedNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newTestHandler(t *testing.T, entries fakeEntries, arts fakeArtifacts) (*Handler, *fakeDiscovery) {
	t.Helper()
	dir := t.TempDir()
	for _, n := range []string{"ipxe.efi", "snponly.efi", "undionly.kpxe"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("binary "+n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	disc := &fakeDiscovery{}
	h, err := NewHandler(HandlerConfig{
		BaseURL:   "http://10.0.0.1:8080",
		Entries:   entries,
		Discovery: disc,
		Artifacts: arts,
		Metadata: fakeMetadata{
			netip.MustParseAddr("10.0.0.50"): `{"hostname":"n50"}`,
			netip.MustParseAddr("::1"):       `{"hostname":"v6"}`,
		},
		BinaryDir: dir,
		Now:       func() time.Time { return fixedNow },
	})
	if err != nil {
		t.Fatal(err)
	}
	return h, disc
}

func get(h http.Handler, target, remote string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("GET", target, nil)
	req.RemoteAddr = remote
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestHandlerScript(t *testing.T) {
	ramdisk := ramdiskEntry()
	entries := fakeEntries{
		"52:54:00:12:34:56": ramdisk,
		"52:54:00:00:00:02": {Kind: KindLocal, Local: LocalExit},
		"52:54:00:00:00:03": {Kind: KindRamdisk}, // invalid
		"52:54:00:00:00:04": {Kind: KindSanboot, ISO: Artifact{Name: "r.iso", URL: "http://o.example/r", SHA256: shaS}},
	}
	h, disc := newTestHandler(t, entries, fakeArtifacts{shaK: true, shaI: true})
	tests := []struct {
		name       string
		query      string
		status     int
		contains   []string
		discovered bool
	}{
		{"ramdisk", "mac=52:54:00:12:34:56&uuid=4c4c4544-0042-3510-8057-b4c04f4b4d32&arch=x86_64", 200, []string{"#!ipxe\n", "initrd=initrd.img", "boot || goto failed"}, false},
		{"without uuid", "mac=52:54:00:12:34:56&arch=x86_64", 200, []string{"kernel --name vmlinuz"}, false},
		{"local", "mac=52:54:00:00:00:02&arch=x86_64", 200, []string{"\nexit\n"}, false},
		{"no entry", "mac=52:54:00:99:99:99&uuid=4C4C4544-0042-3510-8057-B4C04F4B4D32&arch=arm64", 200, []string{"no boot entry", "sleep 10", "chain --replace --autofree http://10.0.0.1:8080/boot.ipxe?mac=52:54:00:99:99:99&uuid=4c4c4544"}, true},
		{"invalid entry", "mac=52:54:00:00:00:03&arch=x86_64", 200, []string{"the boot entry is invalid", "sleep 10"}, false},
		{"iso not cached", "mac=52:54:00:00:00:04&arch=x86_64", 200, []string{"not in the site cache", "sleep 10"}, false},
		{"bad mac", "mac=52:54:00:12:34&arch=x86_64", 400, nil, false},
		{"injection", "mac=52:54:00:12:34:56&arch=x86_64%0Achain+http://evil", 400, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(disc.seen)
			rec := get(h, "/boot.ipxe?"+tt.query, "10.0.0.77:1234")
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			for _, c := range tt.contains {
				if !strings.Contains(rec.Body.String(), c) {
					t.Fatalf("body lacks %q:\n%s", c, rec.Body)
				}
			}
			if tt.status == 200 && !strings.Contains(tt.name, "ramdisk") && tt.name != "without uuid" && strings.Contains(rec.Body.String(), "boot ||") {
				t.Fatalf("a non-booting case boots:\n%s", rec.Body)
			}
			if got := len(disc.seen) - before; got != map[bool]int{true: 1, false: 0}[tt.discovered] {
				t.Fatalf("%d discoveries recorded", got)
			}
		})
	}
	d := disc.seen[0]
	if d.MAC.String() != "52:54:00:99:99:99" || d.UUID != "4c4c4544-0042-3510-8057-b4c04f4b4d32" || d.Arch != "arm64" || d.RemoteAddr != netip.MustParseAddr("10.0.0.77") || !d.Time.Equal(fixedNow) {
		t.Fatalf("discovery recorded as %+v", d)
	}
}

func TestHandlerArtifactsBinariesMetadata(t *testing.T) {
	h, _ := newTestHandler(t, fakeEntries{}, fakeArtifacts{shaK: true})
	tests := []struct {
		name, target, remote string
		status               int
		body                 string
	}{
		{"artifact held", "/artifacts/" + shaK + "/vmlinuz", "10.0.0.5:1", 200, "artifact " + shaK},
		{"artifact not held", "/artifacts/" + shaI + "/initrd", "10.0.0.5:1", 404, ""},
		{"artifact bad sha", "/artifacts/ABC/initrd", "10.0.0.5:1", 400, ""},
		{"artifact bad name", "/artifacts/" + shaK + "/.hidden", "10.0.0.5:1", 400, ""},
		{"binary", "/ipxe/ipxe.efi", "10.0.0.5:1", 200, "binary ipxe.efi"},
		{"binary kpxe", "/ipxe/undionly.kpxe", "10.0.0.5:1", 200, "binary undionly.kpxe"},
		{"binary missing", "/ipxe/ipxe-arm64.efi", "10.0.0.5:1", 404, ""},
		{"binary traversal", "/ipxe/..%2F..%2Fetc%2Fpasswd", "10.0.0.5:1", 404, ""},
		{"metadata own", "/metadata", "10.0.0.50:3333", 200, `{"hostname":"n50"}`},
		{"metadata v6", "/metadata", "[::1]:3333", 200, `{"hostname":"v6"}`},
		{"metadata mapped v4", "/metadata", "[::ffff:10.0.0.50]:3333", 200, `{"hostname":"n50"}`},
		{"metadata other ip", "/metadata", "10.0.0.51:3333", 404, ""},
		{"metadata query ignored", "/metadata?ip=10.0.0.50", "10.0.0.51:3333", 404, ""},
		{"post refused", "", "", 405, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rec *httptest.ResponseRecorder
			if tt.name == "post refused" {
				req := httptest.NewRequest("POST", "/boot.ipxe", nil)
				rec = httptest.NewRecorder()
				h.ServeHTTP(rec, req)
			} else {
				rec = get(h, tt.target, tt.remote)
			}
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d", rec.Code, tt.status)
			}
			if tt.body != "" && rec.Body.String() != tt.body {
				t.Fatalf("body %q, want %q", rec.Body, tt.body)
			}
		})
	}
}

// TestHandlerWithRealCache serves a fetched artifact end to end over loopback HTTP.
func TestHandlerWithRealCache(t *testing.T) {
	body := []byte("a kernel")
	o := newOrigin(t, map[string][]byte{"/k": body})
	c := newTestCache(t, 0)
	h, err := NewHandler(HandlerConfig{BaseURL: "http://127.0.0.1:1", Entries: fakeEntries{}, Discovery: &fakeDiscovery{}, Artifacts: c})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	a := Artifact{Name: "vmlinuz", URL: o.srv.URL + "/k", SHA256: digest(body)}
	url := srv.URL + "/artifacts/" + a.SHA256 + "/vmlinuz"
	if resp, err := http.Get(url); err != nil || resp.StatusCode != 404 {
		t.Fatalf("before fetch: %v %v", resp, err)
	}
	if err := c.Fetch(context.Background(), a); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Range", "bytes=2-")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 64)
	n, _ := resp.Body.Read(buf)
	if resp.StatusCode != 206 || string(buf[:n]) != "kernel" {
		t.Fatalf("range fetch: %d %q", resp.StatusCode, buf[:n])
	}
}

func TestNewHandlerRefusesBadConfig(t *testing.T) {
	base := HandlerConfig{BaseURL: "http://10.0.0.1", Entries: fakeEntries{}, Discovery: &fakeDiscovery{}, Artifacts: fakeArtifacts{}}
	for name, mod := range map[string]func(*HandlerConfig){
		"trailing slash": func(c *HandlerConfig) { c.BaseURL = "http://10.0.0.1/" },
		"query":          func(c *HandlerConfig) { c.BaseURL = "http://10.0.0.1?x=1" },
		"space":          func(c *HandlerConfig) { c.BaseURL = "http://10.0.0.1 x" },
		"no entries":     func(c *HandlerConfig) { c.Entries = nil },
		"no discovery":   func(c *HandlerConfig) { c.Discovery = nil },
		"retry too long": func(c *HandlerConfig) { c.RetryAfter = 2 * time.Hour },
		"missing bindir": func(c *HandlerConfig) { c.BinaryDir = "/nonexistent/bcd" },
	} {
		cfg := base
		mod(&cfg)
		if _, err := NewHandler(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := NewHandler(base); err != nil {
		t.Fatalf("base config refused: %v", err)
	}
}

// TestHandlerNeverLogsToken serves a ramdisk script (which must carry the token) and checks the
// handler's logs never do.
func TestHandlerNeverLogsToken(t *testing.T) {
	var logs strings.Builder
	h, err := NewHandler(HandlerConfig{
		BaseURL: "http://10.0.0.1:8080", Entries: fakeEntries{"52:54:00:12:34:56": ramdiskEntry()},
		Discovery: &fakeDiscovery{}, Artifacts: fakeArtifacts{shaK: true, shaI: true},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := get(h, "/boot.ipxe?mac=52:54:00:12:34:56&arch=x86_64", "10.0.0.9:1")
	if !strings.Contains(rec.Body.String(), "bcd.token="+tok) {
		t.Fatalf("script lacks the token:\n%s", rec.Body)
	}
	if logs.Len() == 0 || strings.Contains(logs.String(), tok) {
		t.Fatalf("logs (%d bytes) leak the token or are empty:\n%s", logs.Len(), logs.String())
	}
}
