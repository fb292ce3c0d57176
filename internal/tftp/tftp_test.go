package tftp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pintftp "github.com/pin/tftp/v3"
	"go.uber.org/goleak"
)

func TestCleanName(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"ipxe.efi", "ipxe.efi", true},
		{"undionly.kpxe", "undionly.kpxe", true},
		{"./ipxe.efi", "ipxe.efi", true},
		{"arm64//ipxe.efi", "arm64/ipxe.efi", true},
		{"a/./b", "a/b", true},
		{"../etc/passwd", "", false},
		{"a/../../etc/passwd", "", false},
		{"a/..", "", false},
		{"..", "", false},
		{"/etc/passwd", "", false},
		{"/ipxe.efi", "", false},
		{"ipxe.efi\x00.txt", "", false},
		{"ipxe\n.efi", "", false},
		{`..\windows`, "", false},
		{`boot\x86\pxeboot.n12`, "", false},
		{".", "", false},
		{"", "", false},
		{strings.Repeat("a", 256), "", false},
	}
	for _, tt := range tests {
		got, err := CleanName(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("CleanName(%q) = %q, %v; want %q ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

type fakeRoute struct {
	name string
	body string
	err  error
}

func (f fakeRoute) TryServe(_ context.Context, name string, w io.ReaderFrom) (bool, error) {
	if name != f.name {
		return false, nil
	}
	if f.err != nil {
		return true, f.err
	}
	_, err := w.ReadFrom(strings.NewReader(f.body))
	return true, err
}

func TestDispatchOrder(t *testing.T) {
	boom := errors.New("boom")
	routes := []Route{
		fakeRoute{name: "a", body: "first a"},
		fakeRoute{name: "a", body: "second a"},
		fakeRoute{name: "b", err: boom},
		fakeRoute{name: "c", body: "c"},
	}
	tests := []struct {
		name, want string
		err        error
	}{
		{"a", "first a", nil},
		{"b", "", boom},
		{"c", "c", nil},
		{"d", "", errNotFound},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		err := Dispatch(context.Background(), routes, tt.name, &buf)
		if !errors.Is(err, tt.err) || buf.String() != tt.want {
			t.Errorf("%s: got %q, %v; want %q, %v", tt.name, buf.String(), err, tt.want, tt.err)
		}
	}
	if err := Dispatch(context.Background(), routes, "../a", &bytes.Buffer{}); err == nil || errors.Is(err, errNotFound) {
		t.Errorf("traversal name: %v", err)
	}
}

// debianIPXEDir makes a directory laid out like Debian's /usr/lib/ipxe, plus a secret beside it.
func debianIPXEDir(t *testing.T) (dir string, files map[string][]byte) {
	base := t.TempDir()
	dir = filepath.Join(base, "ipxe")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files = map[string][]byte{
		"ipxe.efi":      bytes.Repeat([]byte("E"), 1_000_000), // several thousand blocks
		"snponly.efi":   []byte("snponly"),
		"undionly.kpxe": bytes.Repeat([]byte("K"), 512*3), // exact block multiple
	}
	for n, b := range files {
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(base, "secret"), []byte("top secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(base, "secret"), filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	return dir, files
}

func TestServeOverLoopback(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after serveLoopback's cleanup stopped the server
	dir, files := debianIPXEDir(t)
	route, err := NewDirRoute(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer route.Close()
	client := serveLoopback(t, Config{Routes: []Route{route}})
	client.RequestTSize(true)

	for name, want := range files {
		t.Run("get "+name, func(t *testing.T) {
			start := time.Now()
			wt, err := client.Receive(name, "octet")
			if err != nil {
				t.Fatal(err)
			}
			if n, ok := wt.(pintftp.IncomingTransfer).Size(); !ok || n != int64(len(want)) {
				t.Errorf("tsize = %d, %v; want %d", n, ok, len(want))
			}
			var buf bytes.Buffer
			if _, err := wt.WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), want) {
				t.Fatalf("content differs: %d bytes, want %d", buf.Len(), len(want))
			}
			t.Logf("%s: %d bytes in %s", name, buf.Len(), time.Since(start))
		})
	}
	for _, name := range []string{"../secret", "link", "/etc/passwd", "missing.efi", "ipxe.efi/../../secret"} {
		t.Run("refuse "+name, func(t *testing.T) {
			wt, err := client.Receive(name, "octet")
			if err == nil {
				var buf bytes.Buffer
				_, err = wt.WriteTo(&buf)
				if buf.Len() > 0 {
					t.Fatalf("served %q: %q", name, buf.String())
				}
			}
			if err == nil {
				t.Fatalf("%q not refused", name)
			}
		})
	}
	t.Run("write refused", func(t *testing.T) {
		rf, err := client.Send("upload.efi", "octet")
		if err == nil {
			_, err = rf.ReadFrom(strings.NewReader("payload"))
		}
		if err == nil {
			t.Fatal("write accepted")
		}
		if _, statErr := os.Stat(filepath.Join(dir, "upload.efi")); statErr == nil {
			t.Fatal("file written")
		}
	})
}

func TestNewRefusesBadConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("empty config accepted")
	}
	if _, err := New(Config{Routes: []Route{fakeRoute{}}}); err == nil {
		t.Error("config without socket accepted")
	}
	if _, err := NewDirRoute("/nonexistent/bcd-tftp"); err == nil {
		t.Error("missing dir accepted")
	}
}

// serveLoopback serves cfg (its Conn a new loopback socket; 500 ms timeout, 2 retries) until
// the test ends, and returns a client of it with the same timing.
func serveLoopback(t *testing.T, cfg Config) *pintftp.Client {
	t.Helper()
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Conn, cfg.Timeout, cfg.Retries = conn, 500*time.Millisecond, 2
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	client, err := pintftp.NewClient(conn.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	client.SetTimeout(500 * time.Millisecond)
	client.SetRetries(2)
	return client
}
