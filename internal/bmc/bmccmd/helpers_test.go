package bmccmd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"bcd/internal/bmc/ipmi"
	"bcd/internal/bmc/redfish"
	"bcd/internal/lab/vbmc"
	"bcd/internal/lab/vbmc/ipmibmc"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
)

const (
	testUser     = "admin"
	testPassword = "S3cret-pw-7e1f" // distinctive: any appearance in output is a leak
	testUUID     = "11111111-2222-3333-4444-555555555555"
	testGUID     = "66666666-7777-8888-9999-000000000000"
)

// testDeps are quick driver options and an environment without a password.
func testDeps(env map[string]string) deps {
	return deps{
		getenv:   func(k string) string { return env[k] },
		readFile: os.ReadFile,
		redfish: redfish.Options{BackoffInitial: 10 * time.Millisecond, MaxAttempts: 2,
			PollInterval: 20 * time.Millisecond, RequestTimeout: 5 * time.Second},
		ipmi: ipmi.Options{Pacer: ipmi.NewPacer(ipmi.PacerConfig{MinInterval: -1}), Timeout: 500 * time.Millisecond,
			PollInterval: 10 * time.Millisecond, SettleTimeout: 10 * time.Second},
	}
}

// execute runs the command with args and returns what it printed.
func execute(t *testing.T, d deps, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := newCommand(d)
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = cmd.ExecuteContext(ctx)
	return out.String(), errb.String(), err
}

// passwordFile writes pw (with a trailing newline, as editors leave it) to a 0600 file.
func passwordFile(t *testing.T, pw string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bmc-password")
	if err := os.WriteFile(p, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// redfishServer serves a virtual Redfish BMC over TLS on loopback.
type redfishServer struct {
	url, fingerprint string
	caFile           string // PEM of the server's certificate
	svc              *redfishbmc.Service
}

func startRedfish(t *testing.T, m vbmc.Machine, quirks redfishbmc.Quirks) redfishServer {
	t.Helper()
	svc, err := redfishbmc.New(redfishbmc.Config{Layout: redfishbmc.LayoutPlain, Quirks: quirks,
		Username: testUser, Password: testPassword, UUID: testUUID, SerialNumber: "SN-42",
		Manufacturer: "bcd", Model: "virtual", MACs: []string{"52:54:00:12:34:56", "52:54:00:AB:CD:EF"},
		MediaDir: t.TempDir(), Log: slog.New(slog.DiscardHandler)}, m)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(svc)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are expected (pin mismatch)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	raw := srv.Certificate().Raw
	sum := sha256.Sum256(raw)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return redfishServer{url: srv.URL, fingerprint: hex.EncodeToString(sum[:]), caFile: ca, svc: svc}
}

// startIPMI runs a virtual IPMI BMC on 127.0.0.1 for the test's duration.
func startIPMI(t *testing.T, m vbmc.Machine, opts ...func(*ipmibmc.Config)) *ipmibmc.BMC {
	t.Helper()
	cfg := ipmibmc.Config{Addr: "127.0.0.1:0", Username: testUser, Password: testPassword,
		GUID: testGUID, Logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg)
	}
	b, err := ipmibmc.New(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("ipmi bmc: %v", err)
		}
	})
	return b
}

// bmcUnderTest is one virtual BMC and the flags that reach it.
type bmcUnderTest struct {
	name    string
	machine *vbmc.FakeMachine
	conn    []string // --driver, --address, TLS flags
}

// allBMCs starts one machine per way of reaching a BMC: Redfish pinned by fingerprint,
// Redfish trusted by CA, Redfish insecure, IPMI.
func allBMCs(t *testing.T) []bmcUnderTest {
	t.Helper()
	var out []bmcUnderTest
	for _, tls := range []string{"fingerprint", "ca", "insecure"} {
		m := vbmc.NewFakeMachine()
		rf := startRedfish(t, m, redfishbmc.Quirks{})
		conn := []string{"--driver", "redfish", "--address", rf.url}
		switch tls {
		case "fingerprint":
			conn = append(conn, "--fingerprint", rf.fingerprint)
		case "ca":
			conn = append(conn, "--ca", rf.caFile)
		case "insecure":
			conn = append(conn, "--insecure")
		}
		out = append(out, bmcUnderTest{name: "redfish-" + tls, machine: m, conn: conn})
	}
	m := vbmc.NewFakeMachine()
	ib := startIPMI(t, m)
	out = append(out, bmcUnderTest{name: "ipmi", machine: m, conn: []string{"--driver", "ipmi", "--address", ib.Addr().String()}})
	return out
}
