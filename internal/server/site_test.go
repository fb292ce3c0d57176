package server_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/auth"
	"bcd/internal/bmc/redfish"
	"bcd/internal/engine"
	"bcd/internal/lab/vbmc"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
	"bcd/internal/metal"
	"bcd/internal/netboot"
	"bcd/internal/pki"
	"bcd/internal/server"
	"bcd/internal/site"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

const (
	bmcUser = "admin"
	bmcPass = "site-test-bmc-password"
)

// siteEnv is a control plane on loopback (on one store engine) with a Redfish BMC for one
// machine, and what site agents need to join it.
type siteEnv struct {
	t       *testing.T
	ctx     context.Context
	srv     *server.Server
	st      *store.Store
	siteID  string
	log     *slog.Logger
	ramdisk site.RamdiskConfig
	// stuckRamdisk names the same artifacts on an origin that never answers.
	stuckRamdisk site.RamdiskConfig
	machine      *vbmc.FakeMachine
	bmcURL       string
	bmcFP        string
	bmcDown      atomic.Bool // the BMC drops every connection
}

func startSiteEnv(t *testing.T, e store.Engine) *siteEnv {
	t.Helper()
	log := testLog(t)
	srv, ctx := serve(t, server.Config{StoreDSN: storetest.DSN(t, e), Engine: engine.Config{UnreachableAfter: 3}}, log)
	env := &siteEnv{t: t, ctx: ctx, srv: srv, st: srv.Service().Store(), log: log, machine: vbmc.NewFakeMachine()}
	s, err := env.st.Site(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	env.siteID = s.ID

	// The ramdisk's origin.
	files := map[string][]byte{"/vmlinuz": []byte("kernel bytes of the failover test"), "/initrd.img": []byte("initrd bytes of the failover test")}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(origin.Close)
	sum := func(p string) string { s := sha256.Sum256(files[p]); return hex.EncodeToString(s[:]) }
	env.ramdisk = site.RamdiskConfig{
		Kernel: netboot.Artifact{Name: "vmlinuz", URL: origin.URL + "/vmlinuz", SHA256: sum("/vmlinuz")},
		Initrd: netboot.Artifact{Name: "initrd.img", URL: origin.URL + "/initrd.img", SHA256: sum("/initrd.img")},
	}
	// The same artifacts from an origin that never answers: an agent using it installs the
	// entry and then hangs in boot.prepareRamdisk, fetching.
	stuck := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-stuck:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(stuck); slow.Close() })
	env.stuckRamdisk = env.ramdisk
	env.stuckRamdisk.Kernel.URL, env.stuckRamdisk.Initrd.URL = slow.URL+"/vmlinuz", slow.URL+"/initrd.img"

	// The machine's BMC: Redfish over TLS, fingerprint-pinned; bmcDown makes it unreachable.
	svc, err := redfishbmc.New(redfishbmc.Config{Layout: redfishbmc.LayoutPlain, Username: bmcUser, Password: bmcPass,
		UUID: "11111111-2222-3333-4444-555555555555", SerialNumber: "SN-1", Manufacturer: "bcd", Model: "virtual",
		MACs: []string{testMAC}, MediaDir: t.TempDir(), Log: log}, env.machine)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := redfishbmc.SelfSignedCert("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	bmcSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if env.bmcDown.Load() {
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, err := hj.Hijack(); err == nil {
					c.Close()
					return
				}
			}
		}
		svc.ServeHTTP(w, r)
	}))
	bmcSrv.TLS = &tls.Config{Certificates: []tls.Certificate{cert.TLS}}
	bmcSrv.StartTLS()
	t.Cleanup(bmcSrv.Close)
	env.bmcURL, env.bmcFP = bmcSrv.URL, cert.FingerprintSHA256
	return env
}

const testMAC = "52:54:00:fa:11:01"

// agent is a running site agent.
type agent struct {
	*site.Agent
	id     string
	cancel context.CancelFunc
	done   chan error
}

func (a *agent) base() string { return "http://" + a.HTTPAddr().String() }

// startAgent joins and runs a site agent whose gateway traffic goes to gatewayURL (the server's,
// or a proxy in front of it).
func (env *siteEnv) startAgent(name, gatewayURL string, ttl time.Duration, poll site.PollConfig, ramdisk site.RamdiskConfig) *agent {
	t := env.t
	t.Helper()
	tok, err := env.srv.CreateSiteJoinToken(env.ctx, env.siteID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := env.log.With("site_agent", name)
	a, err := site.New(site.Config{
		GatewayURL: gatewayURL, Site: env.siteID, JoinToken: tok, DataDir: filepath.Join(t.TempDir(), name), CAPEM: env.srv.CAPEM(),
		HTTPListener: ln, IPXEDir: t.TempDir(), RetryAfter: time.Second, Ramdisk: ramdisk, LeaseTTL: ttl, Poll: poll,
		// stop models a dead agent here (its network cut first) or checks the lease hand-back;
		// the drain of a clean stop is internal/site's TestStopDrainsHeldCommands.
		DrainTimeout:      -1,
		RedfishOptions:    redfish.Options{BackoffInitial: 10 * time.Millisecond, MaxAttempts: 2, PollInterval: 20 * time.Millisecond, RequestTimeout: 2 * time.Second, Log: log},
		HeartbeatInterval: time.Second, MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(env.ctx)
	ag := &agent{Agent: a, cancel: cancel, done: make(chan error, 1)}
	go func() { ag.done <- a.Run(ctx) }()
	lctx, lcancel := context.WithTimeout(ctx, 20*time.Second)
	defer lcancel()
	l, err := a.Link(lctx)
	if err != nil {
		cancel()
		t.Fatalf("site agent %s did not join: %v", name, err)
	}
	ag.id = l.Identity().AgentID
	t.Cleanup(func() { ag.stop() })
	return ag
}

func (a *agent) stop() {
	a.cancel()
	<-a.done
	a.done <- nil // stop may be called again
}

// enroll enrolls the machine; its workflow goes on to boot it into the ramdisk and waits there.
func (env *siteEnv) enroll() store.Node {
	env.t.Helper()
	admin := auth.Principal{Name: "test", Role: auth.Admin}
	n, err := env.srv.Service().Enroll(env.ctx, admin, metal.EnrollInput{Name: "m1", Pool: "default", MACs: []string{testMAC},
		BMC: metal.BMCInput{Driver: "redfish", Address: env.bmcURL, Username: bmcUser, Password: bmcPass, FingerprintSHA256: env.bmcFP}})
	if err != nil {
		env.t.Fatal(err)
	}
	return n
}

// getScript fetches /boot.ipxe for mac.
func getScript(base, mac string) (int, string) {
	resp, err := http.Get(base + netboot.ScriptPath + "?mac=" + mac + "&arch=x86_64")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// ramdiskToken returns the discovery token of a ramdisk script ("" when body is not one).
func ramdiskToken(code int, body string) string {
	if code != http.StatusOK || !strings.Contains(body, "kernel ") {
		return ""
	}
	_, after, ok := strings.Cut(body, "bcd.token=")
	if !ok {
		return ""
	}
	tok, _, _ := strings.Cut(after, " ")
	return strings.TrimSpace(tok)
}

// waitFor polls cond every 20 ms until it holds or d passed.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !pollUntil(d, cond) {
		t.Fatalf("timed out after %s waiting for %s", d, what)
	}
}

// pollUntil polls cond until it holds (true) or d has passed (false).
func pollUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond) // poll with a deadline: HTTP answers have no change signal
	}
	return true
}

// cuttable is a TCP proxy to the gateway that the test can cut, as a power loss or a network
// partition would: every connection is dropped and no new one is accepted.
type cuttable struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	cut   bool
}

func newCuttable(t *testing.T, target string) *cuttable {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttable{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				u.Close()
				continue
			}
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(u, c); u.Close() }()
			go func() { _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
	t.Cleanup(p.Cut)
	return p
}

func (p *cuttable) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

// TestBootLeaseFailoverAgainstServer: two site agents of one site against a real control plane
// (both store engines). The first holds the boot lease and alone receives the node's
// boot.prepareRamdisk; the machine waits in PXE. The holder dies (its network is cut, then it
// stops: it cannot hand the lease back) — after the command succeeded, or while it still runs
// (the entry installed, the ramdisk still being fetched: nothing reported yet). The time until
// the second agent answers /boot.ipxe for the machine's MAC with the ramdisk script (its entry
// pushed by the control plane with a fresh token that the control plane accepts) is measured and
// logged; DESIGN §6 asks for < 30 s (the test's bound), we aim at < 10 s.
func TestBootLeaseFailoverAgainstServer(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for a lease TTL")
	}
	for _, e := range storetest.Engines {
		for _, midCommand := range []bool{false, true} {
			name := string(e) + "/after-success"
			if midCommand {
				name = string(e) + "/mid-command"
			}
			t.Run(name, func(t *testing.T) { failover(t, e, midCommand) })
		}
	}
}

func failover(t *testing.T, e store.Engine, midCommand bool) {
	const ttl = 5 * time.Second
	env := startSiteEnv(t, e)
	gw := strings.TrimPrefix(env.srv.GatewayURL(), "https://")
	proxy := newCuttable(t, gw)
	holderRamdisk := env.ramdisk
	if midCommand {
		holderRamdisk = env.stuckRamdisk
	}
	a := env.startAgent("a", "https://"+proxy.ln.Addr().String(), ttl, site.PollConfig{}, holderRamdisk)
	waitFor(t, 10*time.Second, "agent a to hold the lease", a.HoldsBootLease)
	b := env.startAgent("b", env.srv.GatewayURL(), ttl, site.PollConfig{}, env.ramdisk)

	n := env.enroll()
	var first string
	prepare := func() (store.Command, bool) {
		cmds, _ := env.st.Commands(env.ctx, n.ID, 100)
		for _, c := range cmds {
			if c.Kind == "boot.prepareRamdisk" {
				return c, true
			}
		}
		return store.Command{}, false
	}
	if midCommand {
		waitFor(t, 60*time.Second, "the holder to install the entry and run the command", func() bool {
			c, ok := prepare()
			return ok && c.State == "running" && a.Entries().Has(testMAC)
		})
	} else {
		waitFor(t, 60*time.Second, "the holder to serve the ramdisk script", func() bool {
			first = ramdiskToken(getScript(a.base(), testMAC))
			return first != ""
		})
	}
	if code, _ := getScript(b.base(), testMAC); code != http.StatusServiceUnavailable {
		t.Fatalf("the standby answered %d, want 503", code)
	}
	if b.Entries().Has(testMAC) {
		t.Fatal("the standby has the entry before it holds the lease: the boot command went to it")
	}
	if c, _ := prepare(); c.TargetAgent != a.id {
		t.Errorf("boot.prepareRamdisk %s went to %q, not the holder %s", c.ID, c.TargetAgent, a.id)
	}

	proxy.Cut()
	killed := time.Now()
	a.stop()
	// The entry comes with the lease (applied before the agent serves), not with a later retry of
	// the boot command.
	waitFor(t, 30*time.Second, "the standby to take the lease", b.HoldsBootLease)
	if !b.Entries().Has(testMAC) {
		t.Error("the new holder serves without the machine's entry")
	}
	var token string
	waitFor(t, 30*time.Second, "the standby to serve the ramdisk script", func() bool {
		token = ramdiskToken(getScript(b.base(), testMAC))
		return token != ""
	})
	took := time.Since(killed)
	t.Logf("failover (%s): the standby served the ramdisk script %.2f s after the holder died (lease TTL %s, renewal every %s)",
		t.Name(), took.Seconds(), ttl, ttl/3)
	if took > 30*time.Second { // DESIGN §6; the figure is logged (aim: < 10 s)
		t.Errorf("failover took %s, want < 30 s", took)
	}
	if token == first {
		t.Error("the pushed entry carries the old holder's token: it should be freshly minted")
	}
	l, err := env.st.Lease(env.ctx, env.siteID)
	if err != nil || l.Holder != b.id || l.Epoch != 2 {
		t.Errorf("lease %+v (%v): want holder %s at epoch 2", l, err, b.id)
	}
	evs, err := env.st.Events(env.ctx, store.EventFilter{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	takeovers := 0
	for _, ev := range evs {
		if ev.Kind == "site.lease" && strings.Contains(ev.Data, `"previous":"`+a.id+`"`) && strings.Contains(ev.Data, `"holder":"`+b.id+`"`) {
			takeovers++
		}
	}
	if takeovers != 1 {
		t.Errorf("%d site.lease events for the takeover by %s, want 1", takeovers, b.id)
	}
	// The pushed token is a real one-time token of the node: the ramdisk can join with it.
	_, csr, err := pki.NewKeyAndCSR("ramdisk")
	if err != nil {
		t.Fatal(err)
	}
	if _, nodeID, _, err := env.srv.Engine().JoinNode(env.ctx, token, csr, "node"); err != nil || nodeID != n.ID {
		t.Errorf("joining with the pushed token: node %q, %v", nodeID, err)
	}
}

// TestPowerPollingAgainstServer: the lease holder polls the node's BMC (the control plane's poll
// set, credentials as JWE to the agent); a change of the machine's power reaches the node's power
// axis with an event; an unreachable BMC raises BMC_UNREACHABLE after 3 failed reads, cleared
// when it answers again (both store engines).
func TestPowerPollingAgainstServer(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			env := startSiteEnv(t, e)
			poll := site.PollConfig{Interval: 100 * time.Millisecond, MaxInterval: 300 * time.Millisecond, Resync: time.Second}
			a := env.startAgent("a", env.srv.GatewayURL(), 5*time.Second, poll, env.ramdisk)
			waitFor(t, 10*time.Second, "the agent to hold the lease", a.HoldsBootLease)
			n := env.enroll()
			power := func() string {
				got, err := env.st.Node(env.ctx, n.ID, "")
				if err != nil {
					t.Fatal(err)
				}
				return got.Power
			}
			// The workflow power-cycles the machine into PXE; then the operator's world moves it.
			waitFor(t, 60*time.Second, "the machine to be on", func() bool { return env.machine.State().On && power() == "on" })
			env.machine.SetOn(false)
			defer func() {
				if t.Failed() {
					p, _ := env.st.PowerPoll(env.ctx, n.ID)
					t.Logf("power %s, polling %+v", power(), p)
					evs, _ := env.st.Events(env.ctx, store.EventFilter{NodeID: n.ID, Limit: 1000})
					for _, ev := range evs {
						t.Logf("event %s %s→%s %s", ev.Kind, ev.FromState, ev.ToState, ev.Reason)
					}
				}
			}()
			waitFor(t, 20*time.Second, "the poller to report the machine off", func() bool { return power() == "off" })

			events := func(kind, contains string) int {
				evs, err := env.st.Events(env.ctx, store.EventFilter{NodeID: n.ID, Limit: 1000})
				if err != nil {
					t.Fatal(err)
				}
				c := 0
				for _, ev := range evs {
					if ev.Kind == kind && strings.Contains(ev.Reason, contains) {
						c++
					}
				}
				return c
			}
			if events("node.power", "power poll: on → off") != 1 {
				t.Error("no node.power event for the change")
			}
			env.bmcDown.Store(true)
			waitFor(t, 30*time.Second, "BMC_UNREACHABLE", func() bool { return events("node.condition", "BMC_UNREACHABLE raised") == 1 })
			p, err := env.st.PowerPoll(env.ctx, n.ID)
			if err != nil || p.UnreachableSince == 0 || p.Failures < 3 || strings.Contains(p.LastError, bmcPass) {
				t.Errorf("polling record %+v (%v)", p, err)
			}
			if got, err := env.st.Node(env.ctx, n.ID, ""); err != nil || got.Conditions["BMC_UNREACHABLE"] != "True" {
				t.Errorf("node conditions %v (%v), want BMC_UNREACHABLE=True", got.Conditions, err)
			}
			env.bmcDown.Store(false)
			waitFor(t, 30*time.Second, "BMC_UNREACHABLE cleared", func() bool { return events("node.condition", "BMC_UNREACHABLE cleared") == 1 })
			if got, err := env.st.Node(env.ctx, n.ID, ""); err != nil || got.Conditions["BMC_UNREACHABLE"] != "" {
				t.Errorf("node conditions %v (%v) after the BMC answered again, want no BMC_UNREACHABLE", got.Conditions, err)
			}
			if events("node.condition", "BMC_UNREACHABLE raised") != 1 {
				t.Error("BMC_UNREACHABLE raised more than once")
			}
			evs, _ := env.st.Events(env.ctx, store.EventFilter{NodeID: n.ID, Limit: 1000})
			for _, ev := range evs {
				if strings.Contains(ev.Reason+ev.Data, bmcPass) {
					t.Errorf("event %s carries the BMC password", ev.Kind)
				}
			}
		})
	}
}

// TestCleanStopHandsTheLeaseBack: a site agent stopped cleanly (SIGTERM) releases the boot lease
// before it disconnects, so the standby takes over at its next renewal, not after the TTL.
func TestCleanStopHandsTheLeaseBack(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			const ttl = 15 * time.Second
			env := startSiteEnv(t, e)
			a := env.startAgent("a", env.srv.GatewayURL(), ttl, site.PollConfig{}, env.ramdisk)
			waitFor(t, 10*time.Second, "agent a to hold the lease", a.HoldsBootLease)
			b := env.startAgent("b", env.srv.GatewayURL(), ttl, site.PollConfig{}, env.ramdisk)
			a.stop()
			if l, err := env.st.Lease(env.ctx, env.siteID); err != nil || l.Holder == a.id {
				t.Fatalf("after a clean stop the lease is %+v (%v): not handed back", l, err)
			}
			stopped := time.Now()
			// Within one renewal period (ttl/3), well before the old lease would have expired.
			waitFor(t, ttl/2, "the standby to take the lease", b.HoldsBootLease)
			t.Logf("the standby took the lease %.2f s after the holder stopped (TTL %s, renewal every %s)", time.Since(stopped).Seconds(), ttl, ttl/3)
		})
	}
}

// The server's /metrics carries its agent gateway's counts: a site agent that joined and holds
// its stream is one join and one open stream of its kind, on an open connection, and nothing
// failed its handshake.
func TestGatewayMetrics(t *testing.T) {
	env := startSiteEnv(t, storetest.Engines[0])
	a := env.startAgent("a", env.srv.GatewayURL(), 5*time.Second, site.PollConfig{}, env.ramdisk)
	waitFor(t, 10*time.Second, "the agent to hold the lease", a.HoldsBootLease)
	api := env.srv.Addr()
	for _, c := range []struct {
		name string
		want func(int) bool
		says string
	}{
		{`bcd_gateway_joins_total{kind="site-agent"}`, func(n int) bool { return n == 1 }, "1"},
		{`bcd_gateway_joins_total{kind="node"}`, func(n int) bool { return n == 0 }, "0"},
		{`bcd_gateway_streams{kind="site-agent"}`, func(n int) bool { return n == 1 }, "1"},
		{`bcd_gateway_streams_opened_total{kind="site-agent"}`, func(n int) bool { return n >= 1 }, "at least 1"},
		{`bcd_gateway_connections`, func(n int) bool { return n >= 1 }, "at least 1"},
		{`bcd_gateway_connections_total`, func(n int) bool { return n >= 2 }, "at least 2 (the join's, the stream's)"},
		{`bcd_gateway_tls_failures_total`, func(n int) bool { return n == 0 }, "0"},
		{`bcd_gateway_join_refusals_total`, func(n int) bool { return n == 0 }, "0"},
		{`bcd_gateway_stream_refusals_total`, func(n int) bool { return n == 0 }, "0"},
	} {
		if n := counter(t, api, c.name); !c.want(n) {
			t.Errorf("%s %d, want %s", c.name, n, c.says)
		}
	}
}
