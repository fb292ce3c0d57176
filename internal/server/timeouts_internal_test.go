package server

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAPIServerTimeouts: the API server bounds how long a client may take to send a request's
// headers and how long an idle keep-alive connection stays open: clients that stall or go
// away do not hold connections (and their goroutines) for ever.
func TestAPIServerTimeouts(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := New(ctx, Config{Listen: "127.0.0.1:0", GatewayListen: "off", DataDir: t.TempDir()}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("server: %v", err)
		}
	}()
	for _, tc := range []struct {
		name string
		d    time.Duration
	}{
		{"ReadHeaderTimeout", s.http.ReadHeaderTimeout},
		{"IdleTimeout", s.http.IdleTimeout},
	} {
		if tc.d <= 0 {
			t.Errorf("the API server has no %s", tc.name)
		}
	}
	if s.http.MaxHeaderBytes <= 0 || s.http.MaxHeaderBytes > 1<<20 {
		t.Errorf("MaxHeaderBytes %d: want a bound below the 1 MiB default", s.http.MaxHeaderBytes)
	}
}

// TestExposedInClear: the server warns when its plain-HTTP API listens where other hosts reach
// it, and only then.
func TestExposedInClear(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:7480", false},
		{"127.0.0.2:7480", false},
		{"[::1]:7480", false},
		{"0.0.0.0:7480", true},
		{"[::]:7480", true},
		{"10.0.0.5:7480", true},
		{"[2001:db8::1]:7480", true},
	} {
		addr, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := exposedInClear(addr); got != tc.want {
			t.Errorf("exposedInClear(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

// TestDataDirPermissions: a data dir group or others may write in is refused (they could
// replace the sealing key or the store); one they may read starts with a warning.
func TestDataDirPermissions(t *testing.T) {
	for _, tc := range []struct {
		mode     os.FileMode
		wantErr  string
		wantWarn bool
	}{
		{0o700, "", false},
		{0o750, "", true},
		{0o755, "", true},
		{0o770, "group or others may write in it", false},
		{0o777, "group or others may write in it", false},
		{0o1777, "group or others may write in it", false},
	} {
		t.Run(tc.mode.String(), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tc.mode); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := New(ctx, Config{Listen: "127.0.0.1:0", GatewayListen: "off", DataDir: dir}, slog.New(slog.NewTextHandler(&logs, nil)))
			if err == nil {
				served := make(chan error, 1)
				go func() { served <- s.Serve(ctx) }()
				cancel()
				if err := <-served; err != nil {
					t.Errorf("server: %v", err)
				}
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("got %v, want %q", err, tc.wantErr)
			}
			if warned := strings.Contains(logs.String(), "data dir is readable by group or others"); warned != tc.wantWarn {
				t.Errorf("warned %v, want %v; logs:\n%s", warned, tc.wantWarn, logs.String())
			}
		})
	}
}
