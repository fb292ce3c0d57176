package sim

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

func start(t *testing.T, st *store.Store, n int) (*Harness, []string) {
	t.Helper()
	return startSlow(t, st, n, 0)
}

func rest(t *testing.T, h *Harness, ids []string) map[string]store.Node {
	t.Helper()
	got, err := h.WaitRest(context.Background(), ids, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func TestReleaseNeedsAnAttestedVerifiedWipe(t *testing.T) {
	cases := []struct {
		name   string
		faults Faults
		fault  string
	}{
		{"read-back failed", Faults{WipeReadbackFail: 1}, "UNVERIFIED_WIPE"},
		{"unsigned result", Faults{UnsignedWipe: true}, "UNVERIFIED_WIPE"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			h, ids := start(t, storetest.Open(t, store.SQLite), 2)
			rest(t, h, ids)
			h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"})
			rest(t, h, ids)
			h.Sim.SetFaults(c.faults)
			h.Apply(ctx, provision.VerbUndeploy, ids, metal.VerbInput{})
			for _, n := range rest(t, h, ids) {
				if n.State != "failed" || n.FaultCode != c.fault || n.FailedFrom != "releasing" || !n.Maintenance {
					t.Fatalf("%s: %s %s from %s maint=%v (%s)", n.Name, n.State, n.FaultCode, n.FailedFrom, n.Maintenance, n.FaultMsg)
				}
			}
			// Recover releases again; with an honest wipe the node becomes ready.
			h.Sim.SetFaults(Faults{})
			h.Apply(ctx, provision.VerbRecover, ids, metal.VerbInput{})
			for _, n := range rest(t, h, ids) {
				if n.State != "ready" {
					t.Fatalf("after recover: %s %s %s", n.Name, n.State, n.FaultCode)
				}
			}
		})
	}
}

func TestAbortRunsCleanupAndRecoverResumes(t *testing.T) {
	ctx := context.Background()
	h, ids := start(t, storetest.Open(t, store.SQLite), 1)
	rest(t, h, ids)
	h.Sim.SetFaults(Faults{Hang: map[string]bool{"deploy.image": true}})
	h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"})
	// Wait until the image write is running, then abort.
	deadline := time.Now().Add(20 * time.Second)
	for {
		cmds, _ := h.Store.Commands(ctx, ids[0], 500)
		if len(cmds) > 0 && cmds[len(cmds)-1].Kind == "deploy.image" && cmds[len(cmds)-1].State == "delivered" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("deploy.image never delivered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, _, err := h.Metal.Apply(ctx, h.Admin, provision.VerbAbort, metal.VerbInput{Node: ids[0], Reason: "wrong image"}); err != nil {
		t.Fatal(err)
	}
	h.Engine.Nudge()
	// The workflow ends aborted after its cleanup (boot.cleanUp) ran.
	deadline = time.Now().Add(20 * time.Second)
	for {
		wfs, _ := h.Store.Workflows(ctx, ids[0], 1)
		if len(wfs) == 1 && wfs[0].State == "aborted" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workflow not aborted: %+v", wfs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmds, _ := h.Store.Commands(ctx, ids[0], 500)
	last := cmds[len(cmds)-1]
	var image store.Command
	for _, c := range cmds {
		if c.Kind == "deploy.image" {
			image = c
		}
	}
	if last.Kind != "boot.cleanUp" || last.State != "succeeded" || image.State != "failed" || !strings.Contains(image.Error, "aborted") {
		t.Fatalf("after abort: last %s %s, image %s %q", last.Kind, last.State, image.State, image.Error)
	}
	n, _ := h.Store.Node(ctx, ids[0], "")
	if n.State != "failed" || n.FaultCode != "ABORTED" || n.FailedFrom != "deploying" {
		t.Fatalf("node after abort: %s %s %s", n.State, n.FaultCode, n.FailedFrom)
	}
	// A failed deploy recovers into releasing (a wipe), then ready.
	h.Sim.SetFaults(Faults{})
	h.Apply(ctx, provision.VerbRecover, ids, metal.VerbInput{})
	if got := rest(t, h, ids)[ids[0]]; got.State != "ready" {
		t.Fatalf("after recover: %s %s", got.State, got.FaultMsg)
	}
}

func TestStepTimeoutRaisesWorkflowTimeout(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	h.Sim.SetFaults(Faults{Hang: map[string]bool{"inventory.refresh": true}})
	h.Apply(ctx, provision.VerbInspect, ids, metal.VerbInput{})
	deadline := time.Now().Add(20 * time.Second)
	for {
		cmds, _ := h.Store.Commands(ctx, ids[0], 500)
		if c := cmds[len(cmds)-1]; c.Kind == "inventory.refresh" && c.State == "delivered" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("inventory.refresh never delivered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Move the store's clock past the step's deadline; the due wake-up finds it.
	st.SetClock(func() time.Time { return time.Now().Add(time.Hour) })
	h.Engine.Nudge()
	got := rest(t, h, ids)[ids[0]]
	if got.State != "failed" || got.FaultCode != "WORKFLOW_TIMEOUT" || got.FailedFrom != "inspecting" {
		t.Fatalf("after the deadline: %s %s from %s (%s)", got.State, got.FaultCode, got.FailedFrom, got.FaultMsg)
	}
}

// TestQueueWaitIsNotTheStepsTime: a step's command that waits in the queue longer than the
// step's timeout (a backlog at a busy site; here the site agent takes nothing) does not fail the
// step: its time runs from when an agent takes it. One no agent takes within the queue timeout
// (30 minutes) fails it, saying so.
func TestQueueWaitIsNotTheStepsTime(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	var offset atomic.Int64
	st.SetClock(func() time.Time { return time.Now().Add(time.Duration(offset.Load())) })
	queued := func() store.Command {
		t.Helper()
		var got store.Command
		waitFor(t, "the inspection's first command queued", func() bool {
			wfs, _ := st.Workflows(ctx, ids[0], 1)
			if len(wfs) == 0 || wfs[0].State != "running" || wfs[0].CurrentCommand == "" {
				return false
			}
			c, err := st.Command(ctx, wfs[0].CurrentCommand)
			got = c
			return err == nil && c.State == "queued"
		})
		return got
	}
	// off waits until the machine's ramdisk has powered it off and the engine knows: an
	// inspection started while the ramdisk that lingered after the last one is still up takes
	// it (fast track) and queues nothing for the site agent.
	off := func() {
		t.Helper()
		waitFor(t, "the machine powered off", func() bool {
			n, err := st.Node(ctx, ids[0], "")
			return err == nil && n.Power == "off" && !h.Sim.Machine(ids[0]).Powered()
		})
	}

	off()
	h.Sim.SetFaults(Faults{SitePaused: true})
	h.Apply(ctx, provision.VerbInspect, ids, metal.VerbInput{})
	c := queued()
	// Ten minutes on, twice the step's timeout (boot.prepareRamdisk: 5 minutes): the engine
	// looks at the step and gives it another timeout, as nobody took the command.
	offset.Store(int64(10 * time.Minute))
	h.Engine.Nudge()
	waitFor(t, "the step looked at again, ten minutes on", func() bool {
		ws, _ := st.WakeUps(ctx, 10)
		return len(ws) == 1 && ws[0].DueAt > time.Now().Add(12*time.Minute).UnixMicro()
	})
	if n, _ := st.Node(ctx, ids[0], ""); n.State != "inspecting" {
		t.Fatalf("after ten minutes in the queue: %s %s %s", n.State, n.FaultCode, n.FaultMsg)
	}
	h.Sim.SetFaults(Faults{})
	if got := rest(t, h, ids)[ids[0]]; got.State != "ready" {
		t.Fatalf("once the site agent took the command: %s %s %s", got.State, got.FaultCode, got.FaultMsg)
	}
	if got, _ := st.Command(ctx, c.ID); got.State != "succeeded" {
		t.Fatalf("the command that waited: %s %s", got.State, got.Error)
	}

	off()
	h.Sim.SetFaults(Faults{SitePaused: true})
	h.Apply(ctx, provision.VerbInspect, ids, metal.VerbInput{})
	queued()
	offset.Add(int64(31 * time.Minute))
	h.Engine.Nudge()
	got := rest(t, h, ids)[ids[0]]
	if got.State != "failed" || got.FaultCode != "WORKFLOW_TIMEOUT" || !strings.Contains(got.FaultMsg, "no agent took its command within 30m0s") {
		t.Fatalf("after 31 minutes in the queue: %s %s %q", got.State, got.FaultCode, got.FaultMsg)
	}
}

func TestEngineRefusesUndeclaredCommandKinds(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	h.Stop()
	// A workflow whose recorded kinds do not include the kind its step sends (a plugin step
	// that did not declare its sends): the engine refuses to send it.
	err := st.Write(ctx, func(tx *store.Tx) error {
		n, err := tx.LockNode(ctx, ids[0], "")
		if err != nil {
			return err
		}
		n.State, n.TargetState, n.ChainVerb = "inspecting", "ready", "inspect"
		if err := tx.UpdateNode(ctx, &n); err != nil {
			return err
		}
		steps, _ := json.Marshal([]map[string]any{{"use": "power.off", "timeout": int64(time.Minute)}})
		w := store.Workflow{NodeID: n.ID, TenantID: n.TenantID, Profile: "plugin", Owner: "metal", NodeState: "inspecting",
			Steps: string(steps), Cleanup: "[]", CommandKinds: []string{"site.httpProxy"}, State: "running", Phase: "steps"}
		if err := tx.InsertWorkflow(ctx, &w); err != nil {
			return err
		}
		return tx.Wake(ctx, n.ID, "test", 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(st, nil, nil2(), engine.Config{})
	if _, err := eng.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	n, _ := st.Node(ctx, ids[0], "")
	if n.State != "failed" || n.FaultCode != "STEP_FAILED" || !strings.Contains(n.FaultMsg, "does not declare") {
		t.Fatalf("undeclared kind: %s %s %q", n.State, n.FaultCode, n.FaultMsg)
	}
	cmds, _ := st.Commands(ctx, ids[0], 500)
	for _, c := range cmds {
		if c.WorkflowID != "" && c.Kind == "bmc.power" && c.CreatedAt > n.CreatedAt && c.Args != "" && strings.Contains(c.Args, `"action":"off"`) && c.State == "queued" {
			t.Fatalf("refused command was queued anyway: %+v", c)
		}
	}
}

// byHand settles one node, stops the harness's engine and agents, and returns an engine the
// test drives by hand with two site agents, A and B, connected.
func byHand(t *testing.T, cfg engine.Config) (*store.Store, *Harness, string, *engine.Engine, engine.Agent, engine.Agent) {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	h.Stop() // drive the queue by hand from here
	eng := engine.New(st, nil, nil2(), cfg)
	a := engine.Agent{ID: "agent-a", Kind: "site", SiteID: h.SiteID, ConnID: "c1"}
	b := engine.Agent{ID: "agent-b", Kind: "site", SiteID: h.SiteID, ConnID: "c2"}
	eng.Connected(ctx, a, "t")
	eng.Connected(ctx, b, "t")
	return st, h, ids[0], eng, a, b
}

// power queues a power command on node for each action.
func power(t *testing.T, h *Harness, node string, actions ...string) {
	t.Helper()
	for _, action := range actions {
		if _, _, err := h.Metal.Apply(context.Background(), h.Admin, provision.VerbPower, metal.VerbInput{Node: node, PowerAction: action}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestSiteAgentFailover(t *testing.T) {
	ctx := context.Background()
	st, h, node, eng, a, b := byHand(t, engine.Config{AgentGrace: time.Millisecond})
	// Two power commands: agent A takes both, acknowledges the first only, then goes away.
	power(t, h, node, "off", "on")
	got, err := eng.Claim(ctx, a, 10)
	if err != nil || len(got) != 2 {
		t.Fatalf("claim by A: %d %v", len(got), err)
	}
	if more, _ := eng.Claim(ctx, a, 10); len(more) != 0 {
		t.Fatalf("a command was offered twice on one connection: %d", len(more))
	}
	if err := eng.Ack(ctx, a, got[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := eng.Ack(ctx, b, got[1].ID); err == nil {
		t.Fatal("B acknowledged A's command")
	}
	eng.Disconnected(ctx, a)
	onB, endB := eng.Subscribe(b)
	defer endB()
	time.Sleep(5 * time.Millisecond) // past the (1 ms) grace; the reaper runs on demand below
	if _, err := eng.ReapForTests(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-onB: // the released command wakes the site's other agents at once
	default:
		t.Fatal("the release of A's command did not wake the site's other agent")
	}
	acked, _ := st.Command(ctx, got[0].ID)
	unacked, _ := st.Command(ctx, got[1].ID)
	if acked.State != "lost" || acked.TargetAgent != "agent-a" {
		t.Fatalf("acknowledged command of the departed agent: %s on %s (want lost, never re-sent)", acked.State, acked.TargetAgent)
	}
	if unacked.State != "queued" || unacked.TargetAgent != "" {
		t.Fatalf("unacknowledged command: %s on %q (want queued for another agent)", unacked.State, unacked.TargetAgent)
	}
	// A, back from a restart, acknowledges again the command it held: the command ended (lost)
	// meanwhile, and A must not run it; nor the one released to the site.
	if err := eng.Ack(ctx, a, got[0].ID); !errors.Is(err, engine.ErrFinished) {
		t.Fatalf("A's ack of its lost command: %v, want ErrFinished", err)
	}
	if err := eng.Ack(ctx, a, got[1].ID); !errors.Is(err, engine.ErrNotYours) {
		t.Fatalf("A's ack of the command released while it was away: %v, want ErrNotYours", err)
	}
	moved, err := eng.Claim(ctx, b, 10)
	if err != nil || len(moved) != 1 || moved[0].ID != got[1].ID {
		t.Fatalf("B claims %d commands (%v), want the unacknowledged one", len(moved), err)
	}
}

// TestAgentsOfADeadServer: a server that stops recording that it is alive (killed, or cut off
// from the store) takes its agents' connections with it. Another server sharing the store ends
// them once the server has been silent for the peer timeout — but only after it has itself been
// alive that long without a gap — and the agents' commands are then released or lost as for any
// departed agent. An agent that reconnected to the live server meanwhile is not touched, and a
// server that comes back records its live connections again.
func TestAgentsOfADeadServer(t *testing.T) {
	ctx := context.Background()
	cfg := engine.Config{AgentGrace: 500 * time.Millisecond, PeerTimeout: time.Second}
	st, h, node, live, _, _ := byHand(t, cfg)
	var mu sync.Mutex
	now := time.Now()
	st.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	advance := func(d time.Duration) {
		mu.Lock()
		now = now.Add(d)
		mu.Unlock()
	}
	beat := func(es ...*engine.Engine) {
		t.Helper()
		for _, e := range es {
			if err := e.Heartbeat(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	dead := engine.New(st, nil, nil2(), cfg)
	c := engine.Agent{ID: "agent-c", Kind: "site", SiteID: h.SiteID, ConnID: "c3"}
	d := engine.Agent{ID: "agent-d", Kind: "site", SiteID: h.SiteID, ConnID: "c4"}
	beat(live, dead)
	for _, a := range []engine.Agent{c, d} {
		if err := dead.Connected(ctx, a, "t"); err != nil {
			t.Fatal(err)
		}
	}
	power(t, h, node, "off", "on")
	got, err := dead.Claim(ctx, c, 10)
	if err != nil || len(got) != 2 {
		t.Fatalf("claim by C: %d %v", len(got), err)
	}
	if err := dead.Ack(ctx, c, got[0].ID); err != nil {
		t.Fatal(err)
	}
	connected := func(id string) bool {
		t.Helper()
		as, err := st.SiteAgents(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			if a.ID == id {
				return a.Connected
			}
		}
		t.Fatalf("no agent %s", id)
		return false
	}
	reap := func(e *engine.Engine) {
		t.Helper()
		if _, err := e.ReapForTests(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The server goes silent. D reconnects to the live server; C does not come back.
	if err := live.Connected(ctx, engine.Agent{ID: d.ID, Kind: "site", SiteID: h.SiteID, ConnID: "c5"}, "t"); err != nil {
		t.Fatal(err)
	}
	for range 3 { // 600 ms: not silent for the peer timeout yet
		advance(200 * time.Millisecond)
		beat(live)
	}
	reap(live)
	if !connected(c.ID) {
		t.Fatal("a connection was ended before its server had been silent for the peer timeout")
	}
	// A server that has just come up (or back, after the store was out) judges nobody.
	for range 5 {
		advance(200 * time.Millisecond)
		beat(live)
	}
	fresh := engine.New(st, nil, nil2(), cfg)
	beat(fresh)
	reap(fresh)
	if !connected(c.ID) {
		t.Fatal("a server alive for less than the peer timeout ended another's connections")
	}
	// The live server, alive without a gap for longer than the peer timeout, ends them: C's
	// acknowledged command is lost, the other released to the site.
	reap(live)
	if connected(c.ID) {
		t.Fatal("the dead server's agent is still connected")
	}
	if !connected(d.ID) {
		t.Fatal("the agent that reconnected to the live server lost its connection")
	}
	acked, _ := st.Command(ctx, got[0].ID)
	unacked, _ := st.Command(ctx, got[1].ID)
	if acked.State != "lost" || unacked.State != "queued" || unacked.TargetAgent != "" {
		t.Fatalf("the dead server's agent's commands: acknowledged %s, unacknowledged %s on %q (want lost; queued for another agent)",
			acked.State, unacked.State, unacked.TargetAgent)
	}
	// The silent server was only cut off: back, it records C's connection again (its
	// commands' fate stands).
	beat(dead)
	if !connected(c.ID) {
		t.Fatal("the server back from silence did not record its live connection again")
	}
	if acked, _ := st.Command(ctx, got[0].ID); acked.State != "lost" {
		t.Fatalf("the lost command is %s again", acked.State)
	}
}

// An agent's acknowledgements of one frame are recorded in one write: its own commands are
// delivered (again, idempotently), and only an unknown command or another agent's is refused.
func TestAckAllRefusesOnlyWhatIsNotTheAgents(t *testing.T) {
	ctx := context.Background()
	st, h, node, eng, a, b := byHand(t, engine.Config{})
	power(t, h, node, "off", "on")
	got, err := eng.Claim(ctx, a, 10)
	if err != nil || len(got) != 2 {
		t.Fatalf("claim by A: %d %v", len(got), err)
	}
	frame := []string{got[0].ID, got[1].ID, "no-such-command"}
	for range 2 { // the second time: acknowledged before, accepted again
		refused, err := eng.AckAll(ctx, a, frame)
		if err != nil {
			t.Fatal(err)
		}
		if len(refused) != 1 || !errors.Is(refused["no-such-command"], store.ErrNotFound) {
			t.Fatalf("refused %v, want the unknown command alone", refused)
		}
	}
	for _, c := range got {
		if c, _ := st.Command(ctx, c.ID); c.State != "delivered" || c.TargetAgent != a.ID {
			t.Errorf("%s: %s on %s, want delivered on A", c.ID, c.State, c.TargetAgent)
		}
	}
	refused, err := eng.AckAll(ctx, b, frame[:2])
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got {
		if !errors.Is(refused[c.ID], engine.ErrNotYours) {
			t.Errorf("B's ack of A's %s: %v, want ErrNotYours", c.ID, refused[c.ID])
		}
	}
}

// An agent whose stream breaks reconnects on a new connection; the old connection's last claim
// and its departure may reach the engine after the new connection arrived. Neither may touch
// what the new connection was offered.
func TestReconnectGetsWhatTheOldConnectionClaimedLate(t *testing.T) {
	ctx := context.Background()
	_, h, node, eng, old, _ := byHand(t, engine.Config{}) // old: agent A's first connection
	cur := engine.Agent{ID: old.ID, Kind: "site", SiteID: h.SiteID, ConnID: "c2"}
	power(t, h, node, "off")
	eng.Connected(ctx, cur, "t")
	// The old connection's claim, late: its answer would go to a dead stream, so it takes
	// nothing.
	if got, err := eng.Claim(ctx, old, 10); err != nil || len(got) != 0 {
		t.Fatalf("late claim of the old connection: %d %v, want nothing taken", len(got), err)
	}
	got, err := eng.Claim(ctx, cur, 10)
	if err != nil || len(got) != 1 {
		t.Fatalf("the new connection was offered %d commands (%v), want the one the old connection would have taken", len(got), err)
	}
	// The old connection's departure, late: the new one's offers stand.
	if err := eng.Disconnected(ctx, old); err != nil {
		t.Fatal(err)
	}
	if again, _ := eng.Claim(ctx, cur, 10); len(again) != 0 {
		t.Fatalf("a command was offered twice on one connection after the old one left: %d", len(again))
	}
	// A new connection is offered it again (its ack may have been lost with the stream).
	next := engine.Agent{ID: "agent-a", Kind: "site", SiteID: h.SiteID, ConnID: "c3"}
	eng.Connected(ctx, next, "t")
	if again, _ := eng.Claim(ctx, next, 10); len(again) != 1 {
		t.Fatalf("a reconnect was offered %d commands, want the unacknowledged one again", len(again))
	}
}

func TestSweepRepairsStrandedNodes(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 2)
	rest(t, h, ids)
	h.Stop()
	// A node moved to inspecting by a writer that forgot its wake-up: nothing would move it.
	err := st.Write(ctx, func(tx *store.Tx) error {
		n, err := tx.LockNode(ctx, ids[0], "")
		if err != nil {
			return err
		}
		n.State, n.TargetState, n.ChainVerb = "inspecting", "ready", "inspect"
		return tx.UpdateNode(ctx, &n)
	})
	if err != nil {
		t.Fatal(err)
	}
	stranded, err := st.StrandedNodes(ctx, 10)
	if err != nil || len(stranded) != 1 || stranded[0].ID != ids[0] {
		t.Fatalf("stranded: %d %v", len(stranded), err)
	}
	eng := engine.New(st, nil, nil2(), engine.Config{})
	if n, err := eng.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("sweep woke %d: %v", n, err)
	}
	if _, err := eng.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	wfs, _ := st.Workflows(ctx, ids[0], 1)
	if len(wfs) != 1 || wfs[0].Profile != "metal-inspect" || wfs[0].State != "running" {
		t.Fatalf("after the sweep: %+v", wfs)
	}
	if stranded, _ := st.StrandedNodes(ctx, 10); len(stranded) != 0 {
		t.Fatalf("still stranded: %d", len(stranded))
	}
}

func TestRevokedSignerStopsTheImageWrite(t *testing.T) {
	ctx := context.Background()
	h, ids := start(t, storetest.Open(t, store.SQLite), 1)
	rest(t, h, ids)
	// The deploy verb accepts the signed image; the signer is revoked before the write starts:
	// the deploy's first command hangs until the revocation is done.
	h.Sim.SetFaults(Faults{Hang: map[string]bool{"boot.prepareRamdisk": true}})
	h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"})
	var hung store.Command
	waitFor(t, "the deploy's boot.prepareRamdisk taken and hung", func() bool {
		wfs, _ := h.Store.Workflows(ctx, ids[0], 1)
		if len(wfs) == 0 || wfs[0].NodeState != "deploying" {
			return false
		}
		cmds, _ := h.Store.Commands(ctx, ids[0], 500)
		for _, c := range cmds {
			if c.Kind == "boot.prepareRamdisk" && c.WorkflowID == wfs[0].ID && c.State == "delivered" {
				hung = c
				return true
			}
		}
		return false
	})
	signers, _ := h.Store.Signers(ctx)
	if err := h.Metal.RevokeSigner(ctx, h.Admin, signers[0].Name); err != nil {
		t.Fatal(err)
	}
	// Release the hang: the hung attempt fails, the step's retry runs normally and the workflow
	// reaches deploy.image, whose command is refused when it is built.
	h.Sim.SetFaults(Faults{})
	h.Engine.Report(ctx, engine.Agent{ID: hung.TargetAgent, Kind: "site"}, engine.Update{CommandID: hung.ID, State: "failed", Error: "test: released"})
	nodes, err := h.WaitRest(ctx, ids, 30*time.Second)
	if err != nil {
		dumpStuck(t, h.Store, nodes)
		t.Fatal(err)
	}
	got := nodes[ids[0]]
	if got.State != "failed" || !strings.Contains(got.FaultMsg, "revoked") {
		t.Fatalf("after revocation: %s %s %q", got.State, got.FaultCode, got.FaultMsg)
	}
	cmds, _ := h.Store.Commands(ctx, ids[0], 500)
	for _, c := range cmds {
		if c.Kind == "deploy.image" {
			t.Fatalf("an image write was sent after its signer was revoked: %+v", c)
		}
	}
}

func TestDiscoveredMachines(t *testing.T) {
	ctx := context.Background()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		h, ids := start(t, st, 1)
		rest(t, h, ids)
		n, _ := st.Node(ctx, ids[0], "")
		a := engine.Agent{ID: "site-a", Kind: "site", SiteID: h.SiteID, ConnID: "c"}
		now := time.Now()
		err := h.Engine.RecordDiscovered(ctx, a, []engine.Discovery{
			{MAC: "52:54:00:AB:CD:EF", UUID: "4C4C4544-0000-1111-2222-333344445555", Arch: "x86_64", FirstSeen: now.Add(-time.Minute), LastSeen: now},
			{MAC: n.MACs[0], Arch: "x86_64"}, // enrolled: not listed
			{MAC: "not-a-mac"},               // dropped
			{MAC: "52:54:00:00:00:99", UUID: "evil'; DROP", Arch: "x86 64"},
		})
		if err != nil {
			t.Fatal(err)
		}
		got, err := st.Discovered(ctx, h.SiteID, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 {
			t.Fatalf("discovered %+v", got)
		}
		byMAC := map[string]store.Discovery{}
		for _, d := range got {
			byMAC[d.MAC] = d
		}
		d := byMAC["52:54:00:ab:cd:ef"]
		if d.UUID != "4c4c4544-0000-1111-2222-333344445555" || d.Arch != "x86_64" || d.AgentID != "site-a" || d.FirstSeen >= d.LastSeen {
			t.Errorf("discovery %+v", d)
		}
		if e := byMAC["52:54:00:00:00:99"]; e.UUID != "" || e.Arch != "" {
			t.Errorf("invalid self-asserted fields kept: %+v", e)
		}
	})
}

// TestCleanStopHandsOver: a server that stops cleanly hands the nodes it leased to the other
// servers at once (not when the leases expire) and ends the agent connections it held, and
// leaves the list of servers.
func TestCleanStopHandsOver(t *testing.T) {
	ctx := context.Background()
	st, h, node, _, _, _ := byHand(t, engine.Config{})
	stopping := engine.New(st, nil, nil2(), engine.Config{})
	c := engine.Agent{ID: "agent-c", Kind: "site", SiteID: h.SiteID, ConnID: "c3"}
	if err := stopping.Connected(ctx, c, "t"); err != nil {
		t.Fatal(err)
	}
	// A wake-up the stopping server holds for an hour (a node it was reconciling).
	if err := st.Write(ctx, func(tx *store.Tx) error { return tx.Wake(ctx, node, "test", 0) }); err != nil {
		t.Fatal(err)
	}
	if ls, err := st.ClaimWakeUps(ctx, stopping.ID(), time.Hour, 10); err != nil || len(ls) != 1 {
		t.Fatalf("lease: %v %v", ls, err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- stopping.Run(runCtx) }()
	deadline := time.Now().Add(10 * time.Second)
	for listed := false; !listed; {
		servers, err := st.Servers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range servers {
			listed = listed || s.ID == stopping.ID()
		}
		if time.Now().After(deadline) {
			t.Fatal("the server never recorded that it was alive")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ls, err := st.ClaimWakeUps(ctx, "another-server", time.Minute, 10); err != nil || len(ls) != 1 || ls[0].NodeID != node {
		t.Fatalf("another server claims %v (%v), want the node the stopped server held", ls, err)
	}
	as, err := st.SiteAgents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		if a.ID == c.ID && a.Connected {
			t.Fatal("the stopped server's agent connection is still recorded")
		}
	}
	servers, err := st.Servers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		if s.ID == stopping.ID() {
			t.Fatal("the stopped server is still listed")
		}
	}
}
