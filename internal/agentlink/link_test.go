package agentlink_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"bcd/internal/agentlink"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/pki"
)

var siteRef = gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: "s1", AgentID: "a1"} //nolint:gochecknoglobals // test fixture, never written

// start runs a gateway with a short poll interval; goleak checks after it stopped.
func start(t *testing.T) *gatewaytest.Env {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	return gatewaytest.Start(t, gateway.Config{PollInterval: 200 * time.Millisecond, Logger: testLogger(t)})
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

func siteConfig(t testing.TB, env *gatewaytest.Env, dir string) agentlink.Config {
	return agentlink.Config{
		GatewayURL: env.URL, CAPEM: env.CA.CertPEM(), DataDir: dir, Kind: agentlink.KindSite,
		JoinToken:  env.Identities.SiteToken(siteRef.SiteID, siteRef.AgentID, time.Hour),
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
		HeartbeatInterval: time.Second, AgentVersion: "test", Logger: testLogger(t),
	}
}

// counter is a Handler that counts executions per command id; commands whose id starts with
// "block" run until their context ends.
type counter struct {
	mu   sync.Mutex
	runs map[string]int
}

func newCounter() *counter { return &counter{runs: map[string]int{}} }

func result(id string) []byte { return []byte(fmt.Sprintf(`{ "id" : %q,"ok":true }`, id)) }

func (c *counter) Run(ctx context.Context, cmd agentlink.Command, report func(agentlink.Progress)) ([]byte, error) {
	c.mu.Lock()
	c.runs[cmd.ID]++
	c.mu.Unlock()
	report(agentlink.Progress{Done: 1, Total: 2, Message: "half"})
	if strings.HasPrefix(cmd.ID, "block") {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}
	return result(cmd.ID), nil
}

func (c *counter) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runs[id]
}

func commands(prefix string, n int) []gateway.Command {
	out := make([]gateway.Command, n)
	for i := range out {
		out[i] = gateway.Command{ID: fmt.Sprintf("%s-%05d", prefix, i), Kind: "bmc.query", NodeID: "n1", Args: []byte(`{"a":1}`)}
	}
	return out
}

func waitFinal(t testing.TB, q *gatewaytest.Queue, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := q.WaitFor(ctx, func(c gatewaytest.Counts) bool { return c.Final >= n }); err != nil {
		t.Fatalf("%v: %d of %d final", err, q.Counts().Final, n)
	}
}

func dial(t testing.TB, ctx context.Context, cfg agentlink.Config, h agentlink.Handler) *agentlink.Link {
	t.Helper()
	l, err := agentlink.Dial(ctx, cfg, h)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func stop(t testing.TB, cancel context.CancelFunc, l *agentlink.Link) {
	t.Helper()
	cancel()
	if err := l.Wait(); err != nil {
		t.Fatalf("link: %v", err)
	}
}

// checkOnce asserts every command is final, ran exactly once and (if it succeeded) carries
// the handler's result bytes.
func checkOnce(t *testing.T, q *gatewaytest.Queue, h *counter, cmds []gateway.Command) {
	t.Helper()
	for _, c := range cmds {
		e, ok := q.Get(c.ID)
		if !ok {
			t.Fatalf("%s: unknown", c.ID)
		}
		if n := h.count(c.ID); n != 1 {
			t.Errorf("%s ran %d times", c.ID, n)
		}
		if e.State != gatewaytest.Succeeded {
			t.Errorf("%s: state %s (%s)", c.ID, e.State, e.Final.Error)
			continue
		}
		if !bytes.Equal(e.Final.Result, result(c.ID)) {
			t.Errorf("%s: result %q", c.ID, e.Final.Result)
		}
	}
}

func TestCommandsFlowAndStatus(t *testing.T) {
	env := start(t)
	cmds := commands("c", 300)
	env.Queue.Enqueue(siteRef, cmds...)
	h := newCounter()
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, siteConfig(t, env, t.TempDir()), h)
	withheld := gateway.WithheldBoot{MAC: "52:54:00:00:00:07", Remote: netip.MustParseAddr("10.0.0.66"), Count: 3, First: time.UnixMilli(3000), Last: time.UnixMilli(4000)}
	l.SetStatus(agentlink.Status{HoldsBootLease: true, Discovered: []agentlink.Discovered{{MAC: "52:54:00:00:00:01", UUID: "u1", Arch: "x86_64", FirstSeen: time.UnixMilli(1000), LastSeen: time.UnixMilli(2000), Inventory: `{"bootMac":"52:54:00:00:00:01"}`}},
		Withheld: []gateway.WithheldBoot{withheld, {MAC: "not-a-mac", Remote: netip.MustParseAddr("10.0.0.67")}}})
	waitFinal(t, env.Queue, len(cmds))
	// More work after the first wave arrives by Notify.
	more := commands("d", 50)
	env.Queue.Enqueue(siteRef, more...)
	waitFinal(t, env.Queue, len(cmds)+len(more))
	qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
	defer qcancel()
	if err := env.Queue.WaitFor(qctx, func(c gatewaytest.Counts) bool { return c.Statuses[gatewaytest.AgentKey(siteRef)] > 0 }); err != nil {
		t.Fatal(err)
	}
	stop(t, cancel, l)

	checkOnce(t, env.Queue, h, append(cmds, more...))
	e, _ := env.Queue.Get(cmds[0].ID)
	if e.Acks != 1 || e.Final.NodeSig != nil {
		t.Errorf("acks %d, sig %x", e.Acks, e.Final.NodeSig)
	}
	st := env.Queue.Statuses(siteRef)[0]
	want := gateway.Discovered{MAC: "52:54:00:00:00:01", UUID: "u1", Arch: "x86_64", FirstSeen: time.UnixMilli(1000), LastSeen: time.UnixMilli(2000)}
	if !st.HoldsBootLease || len(st.Discovered) != 1 || !st.Discovered[0].FirstSeen.Equal(want.FirstSeen) || st.Discovered[0].MAC != want.MAC ||
		st.Discovered[0].Inventory != `{"bootMac":"52:54:00:00:00:01"}` {
		t.Errorf("status %+v", st)
	}
	// The withheld boot scripts cross the wire; a malformed pair is left out at the gateway.
	if len(st.Withheld) != 1 || st.Withheld[0].MAC != withheld.MAC || st.Withheld[0].Remote != withheld.Remote || st.Withheld[0].Count != 3 ||
		!st.Withheld[0].First.Equal(withheld.First) || !st.Withheld[0].Last.Equal(withheld.Last) {
		t.Errorf("withheld boot scripts %+v", st.Withheld)
	}
	if hs := env.Queue.Counts().Hellos; len(hs) == 0 || hs[0].AgentVersion != "test" {
		t.Errorf("hellos %+v", hs)
	}
	for _, f := range []string{agentlink.KeyFile, agentlink.CertFile, agentlink.CAFile, agentlink.JournalFile} {
		fi, err := os.Stat(filepath.Join(siteConfigDir(t, l), f))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v", f, fi.Mode())
		}
	}
}

func siteConfigDir(t *testing.T, l *agentlink.Link) string {
	t.Helper()
	return l.DataDir()
}

// Connections die while commands flow, and some acks are lost so the gateway offers already
// journaled commands again: every command ends, none runs twice.
func TestReconnectNothingLostNothingTwice(t *testing.T) {
	env := start(t)
	var lost sync.Map
	env.Queue.LoseAck = func(id string) bool {
		// Every 7th command's first ack is lost.
		if id[len(id)-1] == '7' {
			_, seen := lost.LoadOrStore(id, true)
			return !seen
		}
		return false
	}
	h := newCounter()
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, siteConfig(t, env, t.TempDir()), h)
	var all []gateway.Command
	for wave := range 8 {
		cmds := commands(fmt.Sprintf("w%d", wave), 250)
		all = append(all, cmds...)
		env.Queue.Enqueue(siteRef, cmds...)
		// Kill mid-wave, as soon as a part of it is final.
		qctx, qcancel := context.WithTimeout(ctx, 20*time.Second)
		if err := env.Queue.WaitFor(qctx, func(c gatewaytest.Counts) bool { return c.Final >= len(all)-200 }); err != nil {
			t.Fatal(err)
		}
		qcancel()
		env.Kill()
	}
	// Reconnects make the lost-ack commands due again.
	env.Kill()
	waitFinal(t, env.Queue, len(all))
	stop(t, cancel, l)
	checkOnce(t, env.Queue, h, all)
	if l.Sessions() < 5 {
		t.Errorf("only %d sessions: the kills did not break streams", l.Sessions())
	}
	reoffered := 0
	for _, c := range all {
		if e, _ := env.Queue.Get(c.ID); e.Claims > 1 {
			reoffered++
		}
	}
	if reoffered == 0 {
		t.Error("no command was offered twice: the journal's dedupe path was not exercised")
	}
	t.Logf("%d commands, %d sessions, %d offered more than once", len(all), l.Sessions(), reoffered)
}

// An agent stops with one command running, others recorded but waiting for a slot, and their
// acks lost; a new agent on the same DataDir runs nothing again, reports what the first one
// finished, and runs what the first one never started (still its own: the server answers its
// acks).
func TestRestartKeepsAtMostOnce(t *testing.T) {
	env := start(t)
	var lostMu sync.Mutex
	lostAcks := map[string]bool{}
	env.Queue.LoseAck = func(id string) bool {
		if strings.HasPrefix(id, "block") || strings.HasPrefix(id, "q-") || strings.HasSuffix(id, "3") {
			lostMu.Lock()
			lostAcks[id] = true
			lostMu.Unlock()
			return true
		}
		return false
	}
	dir := t.TempDir()
	cfg := siteConfig(t, env, dir)
	cfg.MaxConcurrent = 1
	h := newCounter()
	cmds := commands("r", 40)
	env.Queue.Enqueue(siteRef, cmds...)
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, cfg, h)
	waitFinal(t, env.Queue, len(cmds))

	// One block-* command takes the only slot; the others are journaled and acknowledged
	// (acks lost) behind it, never started.
	blocks := commands("block", 6)
	env.Queue.Enqueue(siteRef, blocks...)
	ran := func() (started []string) {
		for _, c := range blocks {
			if h.count(c.ID) > 0 {
				started = append(started, c.ID)
			}
		}
		return started
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		lostMu.Lock()
		n := len(lostAcks)
		lostMu.Unlock()
		if len(ran()) == 1 && n >= len(blocks)+4 {
			break
		}
		time.Sleep(time.Millisecond) // poll: the fake has no signal for a lost ack
	}
	stop(t, cancel, l)
	started := ran()
	if len(started) != 1 {
		t.Fatalf("started before the restart: %v", started)
	}
	for _, c := range blocks {
		if e, _ := env.Queue.Get(c.ID); e.State == gatewaytest.Succeeded || e.State == gatewaytest.Failed {
			t.Fatalf("%s is %s before the restart: the result was not held back", c.ID, e.State)
		}
	}

	// A command recorded by a "crashed" agent: in the journal without a final update.
	crashed := gateway.Command{ID: "crash-1", Kind: "bmc.power", NodeID: "n1"}
	agentlink.AppendReceived(t, dir, crashed.ID)
	env.Queue.Enqueue(siteRef, crashed)

	cfg.JoinToken = "" // the stored certificate is used: no second join
	ctx2, cancel2 := context.WithCancel(context.Background())
	l2 := dial(t, ctx2, cfg, h)
	// Finals: the 40, the block stopped while running, crash-1; and a block the first agent
	// never started now runs (and blocks: one slot).
	waitFinal(t, env.Queue, len(cmds)+2)
	for deadline := time.Now().Add(30 * time.Second); len(ran()) < 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // poll: the handler has no signal
	}
	stop(t, cancel2, l2)

	checkOnce(t, env.Queue, h, cmds)
	if n := h.count("crash-1"); n != 0 {
		t.Errorf("crash-1 ran %d times", n)
	}
	if e, _ := env.Queue.Get("crash-1"); e.State != gatewaytest.Lost || !strings.Contains(e.Final.Error, "interrupted") {
		t.Errorf("crash-1: %s %q", e.State, e.Final.Error)
	}
	after := 0
	for _, c := range blocks {
		e, _ := env.Queue.Get(c.ID)
		n := h.count(c.ID)
		switch {
		case n > 1:
			t.Errorf("%s ran %d times", c.ID, n)
		case c.ID == started[0] && (n != 1 || e.State != gatewaytest.Lost || !strings.Contains(e.Final.Error, "interrupted")):
			t.Errorf("%s, stopped while running: ran %d times, %s %q; want once, interrupted (lost)", c.ID, n, e.State, e.Final.Error)
		case c.ID != started[0] && n == 1:
			after++
		}
		t.Logf("%s: ran %d, claimed %d times, %s: %s", c.ID, n, e.Claims, e.State, e.Final.Error)
	}
	if after == 0 {
		t.Error("no command the first agent never started ran after the restart")
	}
}

func TestAttestedResult(t *testing.T) {
	env := start(t)
	node := gateway.AgentRef{Kind: pki.KindNode, NodeID: "n1", Generation: 1}
	cfg := agentlink.Config{
		GatewayURL: env.URL, CAPEM: env.CA.CertPEM(), Kind: agentlink.KindNode,
		DiscoveryToken: env.Identities.NodeToken("n1", time.Hour),
		Hints:          agentlink.NodeHints{ProductUUID: "4c4c4544-0000", MACs: []string{"52:54:00:00:00:01"}},
		MinBackoff:     5 * time.Millisecond, Logger: testLogger(t),
	}
	wipeResult := []byte("{\"disks\":[{\"dev\":\"/dev/sda\",\"readBack\":\"passed\"}] }\n")
	h := agentlink.HandlerFunc(func(_ context.Context, cmd agentlink.Command, _ func(agentlink.Progress)) ([]byte, error) {
		if cmd.Kind == "disk.wipe" {
			return wipeResult, nil
		}
		return []byte(`{}`), nil
	})
	env.Queue.Enqueue(node,
		gateway.Command{ID: "wipe-1", Kind: "disk.wipe", NodeID: "n1", Generation: 1, Args: []byte(`{"mode":"quick"}`)},
		gateway.Command{ID: "inv-1", Kind: "inventory.refresh", NodeID: "n1", Generation: 1})
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, cfg, h)
	if got := l.Identity(); got != pki.NodeIdentity("n1", 1) {
		t.Fatalf("identity %v", got)
	}
	waitFinal(t, env.Queue, 2)
	stop(t, cancel, l)
	if hints := env.Identities.Hints("n1"); hints.ProductUUID != "4c4c4544-0000" || len(hints.MACs) != 1 {
		t.Errorf("hints %+v", hints)
	}
	e, _ := env.Queue.Get("wipe-1")
	if !bytes.Equal(e.Final.Result, wipeResult) {
		t.Fatalf("result altered: %q", e.Final.Result)
	}
	st := pki.Statement{CommandID: "wipe-1", NodeID: "n1", Kind: "disk.wipe", Generation: 1, ResultSHA256: pki.ResultDigest(e.Final.Result)}
	if err := pki.VerifyStatement(env.CA, e.Final.SignerCertDER, st, e.Final.NodeSig, 1, time.Now()); err != nil {
		t.Fatalf("attestation: %v", err)
	}
	// One altered byte fails verification: the gateway could not have changed it unnoticed.
	st.ResultSHA256 = pki.ResultDigest(append(bytes.Clone(e.Final.Result[:len(e.Final.Result)-1]), ' '))
	if err := pki.VerifyStatement(env.CA, e.Final.SignerCertDER, st, e.Final.NodeSig, 1, time.Now()); !errors.Is(err, pki.ErrBadSignature) {
		t.Fatalf("altered result verified: %v", err)
	}
	if inv, _ := env.Queue.Get("inv-1"); inv.Final.NodeSig != nil || inv.Final.SignerCertDER != nil {
		t.Error("a non-attested result was signed")
	}
}

func TestCancel(t *testing.T) {
	env := start(t)
	h := newCounter()
	env.Queue.Enqueue(siteRef, gateway.Command{ID: "block-c", Kind: "bmc.query"})
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, siteConfig(t, env, t.TempDir()), h)
	deadline := time.Now().Add(10 * time.Second)
	for h.count("block-c") == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	env.Queue.Cancel("block-c")
	waitFinal(t, env.Queue, 1)
	stop(t, cancel, l)
	if e, _ := env.Queue.Get("block-c"); e.State != gatewaytest.Failed || !strings.Contains(e.Final.Error, "canceled") {
		t.Errorf("block-c: %s %q", e.State, e.Final.Error)
	}
}

func TestDeadline(t *testing.T) {
	env := start(t)
	h := newCounter()
	env.Queue.Enqueue(siteRef, gateway.Command{ID: "block-d", Kind: "bmc.query", Deadline: time.Now().Add(100 * time.Millisecond)})
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, siteConfig(t, env, ""), h)
	waitFinal(t, env.Queue, 1)
	stop(t, cancel, l)
	if e, _ := env.Queue.Get("block-d"); e.State != gatewaytest.Failed || !strings.Contains(e.Final.Error, "deadline") {
		t.Errorf("block-d: %s %q", e.State, e.Final.Error)
	}
}

// Reconnect time: from the connection's death to the next stream being recorded.
func TestReconnectTime(t *testing.T) {
	env := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, siteConfig(t, env, t.TempDir()), newCounter())
	key := gatewaytest.AgentKey(siteRef)
	var worst time.Duration
	for i := 1; i <= 5; i++ {
		qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
		if err := env.Queue.WaitFor(qctx, func(c gatewaytest.Counts) bool { return c.Connected[key] >= i }); err != nil {
			t.Fatal(err)
		}
		qcancel()
		t0 := time.Now()
		env.Kill()
		qctx, qcancel = context.WithTimeout(ctx, 10*time.Second)
		if err := env.Queue.WaitFor(qctx, func(c gatewaytest.Counts) bool { return c.Connected[key] > i }); err != nil {
			t.Fatal(err)
		}
		qcancel()
		worst = max(worst, time.Since(t0))
	}
	stop(t, cancel, l)
	t.Logf("reconnect (kill → stream recorded again), worst of 5: %v", worst)
	if worst > 2*time.Second {
		t.Errorf("reconnect took %v", worst)
	}
}

// A command runs only once the gateway answered its ack: one whose ack the control plane
// refuses (it went to another agent) never runs, and one whose ack is still in flight when the
// agent dies does not run then. Restarted on its journal, the agent asks again about the
// commands it never started: it runs the one still its own, once, and not the one the control
// plane refuses (declared lost meanwhile).
func TestNoRunBeforeTheAckIsRecorded(t *testing.T) {
	env := start(t)
	var heldOnce sync.Once
	held := make(chan struct{})    // closed when a hold-* ack reached the queue
	release := make(chan struct{}) // closed to let them through
	var restarted atomic.Bool
	env.Queue.OnAck = func(id string) error {
		switch {
		case strings.HasPrefix(id, "refused"):
			return errors.New("assigned to another agent")
		case strings.HasPrefix(id, "hold-") && !restarted.Load():
			heldOnce.Do(func() { close(held) })
			<-release
		case id == "hold-2":
			return errors.New("declared lost")
		}
		return nil
	}
	h := newCounter()
	dir := t.TempDir()
	cfg := siteConfig(t, env, dir)
	cfg.JoinToken = env.Identities.SiteToken(siteRef.SiteID, siteRef.AgentID, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := dial(t, ctx, cfg, h)

	refused, ok := commands("refused", 3), commands("ok", 3)
	env.Queue.Enqueue(siteRef, append(refused, ok...)...)
	waitFinal(t, env.Queue, len(ok))
	checkOnce(t, env.Queue, h, ok)
	for _, c := range refused {
		if n := h.count(c.ID); n != 0 {
			t.Errorf("%s ran %d times though its ack was refused", c.ID, n)
		}
		if e, _ := env.Queue.Get(c.ID); len(e.Updates) != 0 || e.Acks != 0 {
			t.Errorf("%s: %d updates, %d acks recorded", c.ID, len(e.Updates), e.Acks)
		}
	}

	// The agent dies while the hold-* acks are on their way: they do not run.
	holds := []gateway.Command{{ID: "hold-1", Kind: "bmc.power", NodeID: "n1", Args: []byte(`{"action":"cycle"}`)}, {ID: "hold-2", Kind: "bmc.power", NodeID: "n2", Args: []byte(`{"action":"cycle"}`)}}
	env.Queue.Enqueue(siteRef, holds...)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("no hold-* ack reached the queue")
	}
	for _, c := range holds {
		if n := h.count(c.ID); n != 0 {
			t.Fatalf("%s ran %d times before its ack was recorded", c.ID, n)
		}
	}
	l.Crash()
	if err := l.Wait(); !errors.Is(err, agentlink.ErrCrashed) {
		t.Fatalf("Wait after Crash: %v", err)
	}
	restarted.Store(true)
	close(release)
	for _, c := range holds {
		if n := h.count(c.ID); n != 0 {
			t.Fatalf("%s ran %d times after the crash", c.ID, n)
		}
	}
	cfg.JoinToken = ""
	l2 := dial(t, ctx, cfg, h)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if e, _ := env.Queue.Get("hold-1"); e.State == gatewaytest.Succeeded {
			break
		}
	}
	stop(t, cancel, l2)
	if e, _ := env.Queue.Get("hold-1"); e.State != gatewaytest.Succeeded || h.count("hold-1") != 1 {
		t.Errorf("hold-1: %s %q, ran %d times; want it run once after the restart", e.State, e.Final.Error, h.count("hold-1"))
	}
	if e, _ := env.Queue.Get("hold-2"); len(e.Updates) != 0 || h.count("hold-2") != 0 {
		t.Errorf("hold-2: %d updates, ran %d times; want it never run and not reported", len(e.Updates), h.count("hold-2"))
	}
}

// Drain lets a running command finish and its result reach the gateway, and leaves the
// commands offered meanwhile unacknowledged (for another agent), never run; a command that
// does not finish in time makes Drain return its context's error.
func TestDrain(t *testing.T) {
	env := start(t)
	release := make(chan struct{})
	var mu sync.Mutex
	runs := map[string]int{}
	h := agentlink.HandlerFunc(func(ctx context.Context, cmd agentlink.Command, _ func(agentlink.Progress)) ([]byte, error) {
		mu.Lock()
		runs[cmd.ID]++
		mu.Unlock()
		if strings.HasPrefix(cmd.ID, "slow") {
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return result(cmd.ID), nil
	})
	ran := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		return runs[id]
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, siteConfig(t, env, t.TempDir()), h)
	env.Queue.Enqueue(siteRef, gateway.Command{ID: "slow-1", Kind: "bmc.power", NodeID: "n1"})
	for deadline := time.Now().Add(30 * time.Second); ran("slow-1") == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // poll: the handler has no signal
	}
	// Out of time while slow-1 runs.
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if err := l.Drain(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Drain with slow-1 running: %v, want its deadline", err)
	}
	cancelShort()
	drained := make(chan error, 1)
	go func() { drained <- l.Drain(context.Background()) }()
	env.Queue.Enqueue(siteRef, gateway.Command{ID: "late-1", Kind: "bmc.power", NodeID: "n2"})
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if e, _ := env.Queue.Get("late-1"); e.Claims > 0 {
			break // offered to the draining agent
		}
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned with slow-1 running: %v", err)
	default:
	}
	close(release)
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if e, _ := env.Queue.Get("slow-1"); e.State != gatewaytest.Succeeded || ran("slow-1") != 1 {
		t.Errorf("slow-1: %s, ran %d times; want its result at the gateway when Drain returns", e.State, ran("slow-1"))
	}
	stop(t, cancel, l)
	if e, _ := env.Queue.Get("late-1"); e.Acks != 0 || e.State != gatewaytest.Assigned || ran("late-1") != 0 {
		t.Errorf("late-1: %d acks, %s, ran %d times; want it left unacknowledged for another agent", e.Acks, e.State, ran("late-1"))
	}
}

// Connected is true while a stream is open and answered: once the gateway answered, false
// while the gateway is away, true again on the next stream, false once the link stopped.
func TestConnected(t *testing.T) {
	env := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, siteConfig(t, env, t.TempDir()), newCounter())
	poll(t, 5*time.Second, "connected", l.Connected)
	env.Kill()
	poll(t, 5*time.Second, "a second stream, connected", func() bool { return l.Sessions() >= 2 && l.Connected() })
	stop(t, cancel, l)
	if l.Connected() {
		t.Error("connected after the link stopped")
	}
}
