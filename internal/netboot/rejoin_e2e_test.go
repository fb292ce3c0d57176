package netboot_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/gateway"
	"bcd/internal/metal"
	"bcd/internal/netboot"
	"bcd/internal/pki"
	"bcd/internal/provision"
	"bcd/internal/sim"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/testlog"
)

// syncBuffer is a log sink safe for concurrent writers that the test reads.
type syncBuffer = testlog.Buffer

type oneAddr struct {
	addr netip.Addr
	doc  []byte
}

func (o oneAddr) Metadata(_ context.Context, a netip.Addr) ([]byte, bool) { return o.doc, a == o.addr }

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// osJoins counts the node.join events of kind os at generation gen.
func osJoins(t *testing.T, st *store.Store, node string, gen uint64) int {
	t.Helper()
	evs, err := st.Events(context.Background(), store.EventFilter{NodeID: node, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		var d struct {
			Kind       string `json:"kind"`
			Generation uint64 `json:"generation"`
		}
		if e.Kind == "node.join" && json.Unmarshal([]byte(e.Data), &d) == nil && d.Kind == "os" && d.Generation == gen {
			n++
		}
	}
	return n
}

// (noEntries, nopDiscovery and noArtifacts: contract_test.go.)

// POST /rejoin against a real control plane: a deploy whose kexec'd OS runs no bcd (the
// ramdisk took boot.kexec and never reported: the machine is in the image) waits in
// boot.kexec's await.rejoin; the site agent's join with the node's instance token completes
// it (no fallback power cycle), the node is deployed, and the control plane recorded one join
// of kind os at the node's identity generation. A second POST is 204 without a second join; a
// site agent that forgot (restarted) answers 401, the token being spent; no log line holds the
// token.
func TestRejoinCompletesAwaitRejoin(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, err := sim.Start(ctx, st, sim.Config{}, engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	ids, err := h.Enroll(ctx, "e", 1)
	if err != nil {
		t.Fatal(err)
	}
	id := ids[0]
	if _, err := h.WaitRest(ctx, ids, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	h.Sim.SetFaults(sim.Faults{Hang: map[string]bool{"boot.kexec": true}})
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "boot.kexec delivered", 30*time.Second, func() bool {
		cmds, _ := h.Store.Commands(ctx, id, 500)
		return len(cmds) > 0 && cmds[len(cmds)-1].Kind == "boot.kexec" && cmds[len(cmds)-1].State == "delivered"
	})
	n, err := h.Store.Node(ctx, id, "")
	if err != nil {
		t.Fatal(err)
	}
	// The instance token boot.prepareInstance gave the (simulated) site: the test's own, as
	// the engine makes them.
	token, hash, err := pki.NewToken(pki.InstanceTokenPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Store.Write(ctx, func(tx *store.Tx) error {
		return tx.InsertJoinToken(ctx, store.JoinToken{Hash: hash, Kind: "os", SiteID: n.SiteID, NodeID: id,
			Generation: n.IdentityGeneration, ExpiresAt: tx.At() + time.Hour.Microseconds()})
	}); err != nil {
		t.Fatal(err)
	}

	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	gwURL := startGateway(t, h.Engine, h.CA, log)
	doc, _ := json.Marshal(map[string]string{"nodeId": id, "gateway": gwURL, "instanceToken": token, "ca": string(h.CA.CertPEM())})
	node := oneAddr{addr: netip.MustParseAddr("10.0.0.50"), doc: doc}
	newHandler := func() *netboot.Handler {
		nb, err := netboot.NewHandler(netboot.HandlerConfig{BaseURL: "http://10.0.0.1:8080", Entries: noEntries{}, Discovery: nopDiscovery{},
			Artifacts: noArtifacts{}, Metadata: node, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		return nb
	}
	rejoin := func(nb *netboot.Handler) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", netboot.RejoinPath, nil).WithContext(ctx)
		req.RemoteAddr = "10.0.0.50:40000"
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		nb.ServeHTTP(rec, req)
		return rec
	}

	nb := newHandler()
	start := time.Now()
	if rec := rejoin(nb); rec.Code != http.StatusNoContent {
		t.Fatalf("POST /rejoin: %d %s", rec.Code, rec.Body)
	}
	t.Logf("POST /rejoin answered 204 after %s", time.Since(start).Round(time.Millisecond))
	rested, err := h.WaitRest(ctx, ids, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got := rested[id]; got.State != string(provision.Deployed) {
		t.Fatalf("node %s %s %s", got.State, got.FaultCode, got.FaultMsg)
	}
	cmds, _ := h.Store.Commands(ctx, id, 500)
	kexecAt := -1
	for i, c := range cmds {
		if c.Kind == "boot.kexec" {
			kexecAt = i
		}
		if kexecAt >= 0 && c.Kind == "bmc.power" {
			t.Fatalf("the fallback power cycle ran: the rejoin did not complete boot.kexec (%s %s)", c.Kind, c.Args)
		}
	}
	if got := osJoins(t, h.Store, id, n.IdentityGeneration); got != 1 {
		t.Fatalf("%d os joins at generation %d, want 1", got, n.IdentityGeneration)
	}

	// Again: done already, no second join.
	if rec := rejoin(nb); rec.Code != http.StatusNoContent {
		t.Fatalf("second POST /rejoin: %d %s", rec.Code, rec.Body)
	}
	// A site agent that does not remember the join: the token is spent by another key.
	rec := rejoin(newHandler())
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "prepare the instance again") {
		t.Fatalf("POST /rejoin with a spent token: %d %s", rec.Code, rec.Body)
	}
	if got := osJoins(t, h.Store, id, n.IdentityGeneration); got != 1 {
		t.Fatalf("%d os joins after the repeated POSTs, want 1", got)
	}
	if l := logs.String(); !strings.Contains(l, "rejoined the gateway on behalf of a node's installed OS") || strings.Contains(l, token) {
		t.Fatalf("logs lack the rejoin or hold the token:\n%s", l)
	}
}

// startGateway serves the engine's agent gateway on loopback TLS, as the server does.
func startGateway(t *testing.T, e *engine.Engine, ca *pki.CA, log *slog.Logger) string {
	t.Helper()
	cert, err := pki.NewServerCert(ca, []string{"127.0.0.1"}, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	g := e.Gateway()
	srv, err := gateway.New(gateway.Config{Queue: g, Identities: g, Sites: g, CA: ca, Logger: log, Watermark: g.Watermark, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, hd := srv.Handler()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gateway.ServeTLS(ctx, ln, cert, g.Wrap(hd), log) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return "https://" + ln.Addr().String()
}
