package site_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"bcd/internal/bmc/ipmi"
	"bcd/internal/bmc/redfish"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/lab/vbmc"
	"bcd/internal/lab/vbmc/ipmibmc"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
	"bcd/internal/netboot"
	"bcd/internal/pki"
	"bcd/internal/site"
	"bcd/internal/testlog"
)

const testSite = "s1"

// syncBuffer is a log sink safe for concurrent writers that the test reads.
type syncBuffer = testlog.Buffer

// logger writes debug logs to buf (and stderr with -v).
func logger(t testing.TB, buf *syncBuffer) *slog.Logger {
	var w io.Writer = buf
	if testing.Verbose() {
		w = io.MultiWriter(buf, os.Stderr)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
}

// startGateway runs a gateway on loopback; goroutine leaks are checked after everything stopped.
func startGateway(t *testing.T) *gatewaytest.Env {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	return gatewaytest.Start(t, gateway.Config{PollInterval: 100 * time.Millisecond})
}

// ramdiskOrigin serves a kernel and an initrd on loopback and returns the site's ramdisk config.
func ramdiskOrigin(t *testing.T) site.RamdiskConfig {
	t.Helper()
	files := map[string][]byte{"/vmlinuz": []byte("kernel bytes for the test"), "/initrd.img": []byte("initrd bytes for the test")}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	sum := func(p string) string { s := sha256.Sum256(files[p]); return hex.EncodeToString(s[:]) }
	return site.RamdiskConfig{
		Kernel: netboot.Artifact{Name: "vmlinuz", URL: srv.URL + "/vmlinuz", SHA256: sum("/vmlinuz")},
		Initrd: netboot.Artifact{Name: "initrd.img", URL: srv.URL + "/initrd.img", SHA256: sum("/initrd.img")},
	}
}

type testAgent struct {
	*site.Agent
	ref    gateway.AgentRef
	cancel context.CancelFunc
	done   chan error
}

// stop ends the agent and checks it ended cleanly.
func (a *testAgent) stop(t testing.TB) {
	t.Helper()
	a.cancel()
	if err := <-a.done; err != nil {
		t.Errorf("agent %s: %v", a.ref.AgentID, err)
	}
}

// agentConfig is a site agent on loopback: HTTP on 127.0.0.1:0, no TFTP or DHCP.
func agentConfig(t *testing.T, env *gatewaytest.Env, agentID, dir string, log *slog.Logger) site.Config {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return site.Config{
		GatewayURL: env.URL, Site: testSite, DataDir: dir, CAPEM: env.CA.CertPEM(),
		JoinToken:    env.Identities.SiteToken(testSite, agentID, time.Hour),
		HTTPListener: ln, IPXEDir: t.TempDir(), RetryAfter: time.Second,
		Ramdisk:           ramdiskOrigin(t),
		RedfishOptions:    redfish.Options{BackoffInitial: 10 * time.Millisecond, MaxAttempts: 2, PollInterval: 20 * time.Millisecond, RequestTimeout: 5 * time.Second, Log: log},
		IPMIOptions:       ipmi.Options{Timeout: 500 * time.Millisecond, PollInterval: 20 * time.Millisecond, SettleTimeout: 10 * time.Second, Logger: log},
		HeartbeatInterval: time.Second, MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Logger: log,
	}
}

// startAgent builds and runs an agent until the test ends (or stop).
func startAgent(t *testing.T, cfg site.Config, agentID string) *testAgent {
	t.Helper()
	a, err := site.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ta := &testAgent{Agent: a, cancel: cancel, done: make(chan error, 1),
		ref: gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: testSite, AgentID: agentID}}
	go func() { ta.done <- a.Run(ctx) }()
	lctx, lcancel := context.WithTimeout(ctx, 20*time.Second)
	defer lcancel()
	if _, err := a.Link(lctx); err != nil {
		cancel()
		t.Fatalf("agent %s did not join: %v (%v)", agentID, err, <-ta.done)
	}
	t.Cleanup(func() {
		select {
		case <-ctx.Done():
		default:
			ta.stop(t)
		}
	})
	return ta
}

// certDER is the agent's certificate, to encrypt credentials to it.
func (a *testAgent) certDER(t testing.TB) []byte {
	t.Helper()
	l, err := a.Link(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return l.CertDER()
}

// do enqueues one command for agent and waits for its final update.
func do(t *testing.T, env *gatewaytest.Env, a *testAgent, id, kind, nodeID string, args map[string]any) gateway.Update {
	t.Helper()
	b, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	env.Queue.Enqueue(a.ref, gateway.Command{ID: id, Kind: kind, NodeID: nodeID, Args: b, Deadline: time.Now().Add(time.Minute)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		n := env.Queue.Counts().Final // before Get: a final update in between makes WaitFor return
		if e, _ := env.Queue.Get(id); e.Final.Final() {
			return e.Final
		}
		// WaitFor calls its condition under the queue's lock: only Counts may be read there.
		if err := env.Queue.WaitFor(ctx, func(c gatewaytest.Counts) bool { return c.Final > n }); err != nil {
			t.Fatalf("command %s (%s): %v", id, kind, err)
		}
	}
}

// credentials encrypts {username, password} to the agent.
func credentials(t testing.TB, certDER []byte, user, pass string) string {
	t.Helper()
	plain, _ := json.Marshal(map[string]string{"username": user, "password": pass})
	jwe, err := pki.EncryptToAgent(certDER, plain)
	if err != nil {
		t.Fatal(err)
	}
	return jwe
}

// redfishBMC serves a virtual Redfish BMC over TLS on loopback.
func redfishBMC(t *testing.T, m vbmc.Machine, user, pass string, macs []string, log *slog.Logger, opts ...func(*redfishbmc.Config)) (url, fingerprint string) {
	t.Helper()
	cfg := redfishbmc.Config{Layout: redfishbmc.LayoutPlain, Username: user, Password: pass,
		UUID: "11111111-2222-3333-4444-555555555555", SerialNumber: "SN-1", Manufacturer: "bcd", Model: "virtual",
		MACs: macs, MediaDir: t.TempDir(), Log: log}
	for _, o := range opts {
		o(&cfg)
	}
	svc, err := redfishbmc.New(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := redfishbmc.SelfSignedCert("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(svc)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert.TLS}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.URL, cert.FingerprintSHA256
}

// ipmiBMC runs a virtual IPMI BMC on 127.0.0.1.
func ipmiBMC(t *testing.T, m vbmc.Machine, user, pass string, log *slog.Logger, opts ...func(*ipmibmc.Config)) string {
	t.Helper()
	cfg := ipmibmc.Config{Addr: "127.0.0.1:0", Username: user, Password: pass,
		GUID: "66666666-7777-8888-9999-000000000000", Logger: log}
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
	return b.Addr().String()
}

// getScript fetches /boot.ipxe for mac from base.
func getScript(t testing.TB, base, mac string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + netboot.ScriptPath + "?mac=" + mac + "&arch=x86_64")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type (
	gatewayEnv        = gatewaytest.Env
	gatewaytestCounts = gatewaytest.Counts
)

// waitHolds waits until the agent serves (its first lease answer arrived).
func waitHolds(t *testing.T, a *testAgent) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !a.HoldsBootLease() {
		if time.Now().After(deadline) {
			t.Fatalf("agent %s does not serve after 10 s", a.ref.AgentID)
		}
		time.Sleep(10 * time.Millisecond) // poll with a deadline: the hold has no exported change signal
	}
}
