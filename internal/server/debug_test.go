package server_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"bcd/internal/server"
)

// --debug-listen serves the runtime's profiles on loopback: their list, each by name (binary,
// gzip-compressed as go tool pprof reads it, or text with ?debug=1), a CPU profile over the
// seconds asked; never the command line (a DSN's password may be on it); a bad parameter is
// refused saying what is accepted.
func TestDebugListenerServesProfiles(t *testing.T) {
	srv, _ := serve(t, server.Config{DebugListen: "127.0.0.1:0"}, testLog(t))
	base := "http://" + srv.DebugAddr() + "/debug/pprof/"
	if srv.DebugAddr() == "" {
		t.Fatal("no debug address")
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	gzipped := func(b string) bool { return strings.HasPrefix(b, "\x1f\x8b") }
	for _, c := range []struct {
		path string
		code int
		ok   func(string) bool
		says string
	}{
		{"", 200, func(b string) bool { return strings.Contains(b, "heap") && strings.Contains(b, "goroutine") }, "the list of profiles"},
		{"heap", 200, gzipped, "a gzip-compressed profile"},
		{"allocs", 200, gzipped, "a gzip-compressed profile"},
		{"goroutine?debug=1", 200, func(b string) bool { return strings.Contains(b, "goroutine profile:") }, "a text goroutine profile"},
		{"profile?seconds=1", 200, gzipped, "a gzip-compressed CPU profile"},
		{"cmdline", 404, func(string) bool { return true }, "nothing"},
		{"symbol", 404, func(string) bool { return true }, "nothing"},
		{"profile?seconds=0", 400, func(b string) bool { return strings.Contains(b, "from 1 to 300") }, "what is accepted"},
		{"trace?seconds=many", 400, func(b string) bool { return strings.Contains(b, "from 1 to 300") }, "what is accepted"},
		{"heap?debug=7", 400, func(b string) bool { return strings.Contains(b, "use 0") }, "what is accepted"},
	} {
		code, body := get(c.path)
		if code != c.code || !c.ok(body) {
			t.Errorf("GET %s: %d %.80q, want %d and %s", c.path, code, body, c.code, c.says)
		}
	}
	if resp, err := http.Post(base+"heap", "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST heap: %v %v, want 405", resp, err)
	} else {
		resp.Body.Close()
	}
}

// The profiles are for an operator at the machine: any address but loopback is refused, naming
// what is accepted; without the flag there is no debug listener.
func TestDebugListenerOnLoopbackOnly(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", "192.0.2.1:7482", ":7482", "no-port"} {
		dir := filepath.Join(t.TempDir(), "data")
		_, err := server.New(context.Background(), server.Config{DataDir: dir, Listen: "127.0.0.1:0", GatewayListen: "off", DebugListen: addr}, testLog(t))
		if err == nil || !strings.Contains(err.Error(), "loopback") {
			t.Errorf("--debug-listen %s: %v, want a refusal naming loopback", addr, err)
		}
		// Refused before anything was opened or created.
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("--debug-listen %s: the data directory was made before the refusal (%v)", addr, err)
		}
	}
	srv, _ := serve(t, server.Config{}, testLog(t))
	if a := srv.DebugAddr(); a != "" {
		t.Errorf("debug address %q without --debug-listen", a)
	}
}
