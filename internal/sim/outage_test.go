package sim

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestOutageIsNotTheStepsTime: the control plane stops (an upgrade) while a site agent holds a
// step's command, and comes back after longer than the step's timeout. The agent did the work
// meanwhile and reports it once it reconnects. The time no server was alive does not count
// against the step: the new server does not fail it (before, the workflow failed with
// WORKFLOW_TIMEOUT and the node waited in maintenance), nor sends its command again.
func TestOutageIsNotTheStepsTime(t *testing.T) {
	ctx := context.Background()
	cfg := engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond, PeerTimeout: 600 * time.Millisecond}
	st, h, node, _, _, _ := byHand(t, cfg)
	var offset atomic.Int64
	st.SetClock(func() time.Time { return time.Now().Add(time.Duration(offset.Load())) })
	a := engine.Agent{ID: "agent-a", Kind: "site", SiteID: h.SiteID, ConnID: "c1"}

	first := engine.New(st, nil, nil2(), cfg)
	stopFirst := runEngine(t, first)
	if err := first.Connected(ctx, a, "t"); err != nil {
		t.Fatal(err)
	}
	c := inspectionTaken(t, h, first, a, node)
	stopFirst()
	was := openWorkflow(t, st, node)
	if was.CurrentCommand != c.ID {
		t.Fatalf("the step waits on %q, not on the command taken (%s)", was.CurrentCommand, c.ID)
	}

	// Ten minutes without a server: twice the step's timeout (boot.prepareRamdisk, 5 minutes).
	offset.Store(int64(10 * time.Minute))
	second := engine.New(st, nil, nil2(), cfg)
	before := second.Reconciliations()
	stopSecond := runEngine(t, second)
	defer stopSecond()
	waitFor(t, "the new server to look at the node", func() bool { second.Nudge(); return second.Reconciliations() > before })
	wf := openWorkflow(t, st, node)
	if wf.State != "running" || wf.CurrentCommand != c.ID || wf.StepIndex != was.StepIndex || wf.StepAttempt != was.StepAttempt {
		cmds, _ := st.Commands(ctx, node, 10)
		for _, c := range cmds {
			t.Logf("command %s %s %s %s", c.ID, c.Kind, c.State, c.Error)
		}
		t.Fatalf("after the outage the workflow is %s at step %d, on command %q, attempt %d (%s); before it: step %d, command %s (%s), attempt %d: the outage counted as the step's time",
			wf.State, wf.StepIndex, wf.CurrentCommand, wf.StepAttempt, wf.Error, was.StepIndex, c.ID, c.Kind, was.StepAttempt)
	}
	if got, _ := st.Command(ctx, c.ID); got.State != "delivered" {
		t.Fatalf("the command the agent holds is %s", got.State)
	}
	if got := wf.StepDeadline - was.StepDeadline; got < (10 * time.Minute).Microseconds() {
		t.Fatalf("the step's deadline moved by %s, less than the outage", time.Duration(got)*time.Microsecond)
	}
	// The agent reconnects and reports the work it did meanwhile: the step goes on.
	a.ConnID = "c2"
	if err := second.Connected(ctx, a, "t"); err != nil {
		t.Fatal(err)
	}
	if err := second.Report(ctx, a, engine.Update{CommandID: c.ID, State: "succeeded", Result: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next step", func() bool {
		wf := openWorkflow(t, st, node)
		return wf.CurrentCommand != c.ID
	})
	if n, _ := st.Node(ctx, node, ""); n.State != "inspecting" || n.FaultCode != "" {
		t.Fatalf("node %s %s %s", n.State, n.FaultCode, n.FaultMsg)
	}

	// An outage is only a time no server was alive: a step's deadline passing while a server
	// runs still fails it (TestStepTimeoutRaisesWorkflowTimeout, with retries here).
}

// runEngine runs e until the returned stop is called.
func runEngine(t *testing.T, e *engine.Engine) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// inspectionTaken starts node's inspection and returns its first command, taken and
// acknowledged by the site agent a.
func inspectionTaken(t *testing.T, h *Harness, e *engine.Engine, a engine.Agent, node string) store.Command {
	t.Helper()
	ctx := context.Background()
	if err := h.Apply(ctx, provision.VerbInspect, []string{node}, metal.VerbInput{}); err != nil {
		t.Fatal(err)
	}
	e.Nudge()
	var taken []store.Command
	waitFor(t, "the inspection's first command taken by the site agent", func() bool {
		got, err := e.Claim(ctx, a, 10)
		if err != nil {
			t.Fatal(err)
		}
		taken = append(taken, got...)
		return len(taken) > 0
	})
	if err := e.Ack(ctx, a, taken[0].ID); err != nil {
		t.Fatal(err)
	}
	return taken[0]
}

func openWorkflow(t *testing.T, st *store.Store, node string) store.Workflow {
	t.Helper()
	wfs, err := st.Workflows(context.Background(), node, 1)
	if err != nil || len(wfs) == 0 {
		t.Fatalf("workflows of %s: %v %v", node, wfs, err)
	}
	return wfs[0]
}

// TestClockStepIsNotTheStepsTime: the wall clock of a running server (SQLite) stepping forward
// (NTP stepping it, the host resumed from a suspend) does not time out the steps in progress:
// the store's time follows it only at the next heartbeat, which gives the steps that time back
// in the same write. Without that, the reconciler would find the step's deadline passed.
func TestClockStepIsNotTheStepsTime(t *testing.T) {
	cfg := engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond, PeerTimeout: 600 * time.Millisecond}
	st, h, node, e, a, _ := byHand(t, cfg)
	var offset atomic.Int64
	st.SetWall(func() time.Time { return time.Now().Add(time.Duration(offset.Load())) })
	defer runEngine(t, e)()
	c := inspectionTaken(t, h, e, a, node)
	was := openWorkflow(t, st, node)

	// Ten minutes forward: twice the step's timeout (boot.prepareRamdisk, 5 minutes).
	offset.Store(int64(10 * time.Minute))
	// The heartbeat's write moves the deadline; the store's time follows the wall once that
	// write committed (Reanchor, right after it): both are waited for.
	waitFor(t, "the step's deadline to move by the step, and the store's time to follow the stepped wall clock", func() bool {
		e.Nudge()
		return openWorkflow(t, st, node).StepDeadline-was.StepDeadline >= (10*time.Minute-time.Second).Microseconds() &&
			st.WallStep().Abs() <= time.Second
	})
	stepStillWaits(t, st, e, a, node, was, c, "the clock stepped")
}

// stepStillWaits checks what a clock step must leave after it: the reconciler, looking at the
// node at the new time, finds its workflow still waiting at the step it was at (was) on command
// c; one control_plane.clock_step event says why; and the agent a's report moves the workflow on.
func stepStillWaits(t *testing.T, st *store.Store, e *engine.Engine, a engine.Agent, node string, was store.Workflow, c store.Command, why string) {
	t.Helper()
	ctx := context.Background()
	before := e.Reconciliations()
	if err := st.Write(ctx, func(tx *store.Tx) error { return tx.Wake(ctx, node, "test", 0) }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a reconciliation at the new time", func() bool { e.Nudge(); return e.Reconciliations() > before })
	wf := openWorkflow(t, st, node)
	if wf.State != "running" || wf.CurrentCommand != c.ID || wf.StepIndex != was.StepIndex || wf.StepAttempt != was.StepAttempt {
		t.Fatalf("after the clock step the workflow is %s at step %d, on command %q, attempt %d (%s): the step counted as the step's time",
			wf.State, wf.StepIndex, wf.CurrentCommand, wf.StepAttempt, wf.Error)
	}
	if moved := time.Duration(wf.StepDeadline-was.StepDeadline) * time.Microsecond; moved > 11*time.Minute {
		t.Fatalf("the step's deadline moved by %s: the step was given back more than once", moved)
	}
	evs, err := st.Events(ctx, store.EventFilter{Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	steps := 0
	for _, ev := range evs {
		if ev.Kind == "control_plane.clock_step" {
			steps++
			if !strings.HasPrefix(ev.Reason, why) {
				t.Errorf("clock step event: %q, want it to begin %q", ev.Reason, why)
			}
		}
	}
	if steps != 1 {
		t.Fatalf("%d clock-step events, want one", steps)
	}
	if err := e.Report(ctx, a, engine.Update{CommandID: c.ID, State: "succeeded", Result: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next step", func() bool { return openWorkflow(t, st, node).CurrentCommand != c.ID })
}

// TestDatabaseClockStepIsNotTheStepsTime: the database's clock stepping forward (PostgreSQL,
// whose clock the servers keep) does not time out the steps in progress: each server sees the
// step as a jump of the database's offset from its own clock at its next heartbeat, the first
// gives the steps that time back before its store takes the new time, and the others, seeing
// the same step, do not give it again. (The servers' local clocks stepping back by the same
// amount is what a server sees of it.)
func TestDatabaseClockStepIsNotTheStepsTime(t *testing.T) {
	ctx := context.Background()
	dsn := storetest.DSN(t, store.Postgres)
	var back atomic.Int64
	local := func() time.Time { return time.Now().Add(-time.Duration(back.Load())) }
	open := func() *store.Store {
		st, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		st.SetLocalClock(local)
		return st
	}
	st, other := open(), open()
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	h.Stop()
	node := ids[0]
	cfg := engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond, PeerTimeout: 600 * time.Millisecond}
	e := engine.New(st, nil, nil2(), cfg)
	second := engine.New(other, nil, nil2(), cfg)
	if err := second.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	defer runEngine(t, e)()
	a := engine.Agent{ID: "agent-a", Kind: "site", SiteID: h.SiteID, ConnID: "c1"}
	if err := e.Connected(ctx, a, "t"); err != nil {
		t.Fatal(err)
	}
	c := inspectionTaken(t, h, e, a, node)
	was := openWorkflow(t, st, node)

	// Ten minutes forward: twice the step's timeout (boot.prepareRamdisk, 5 minutes).
	back.Store(int64(10 * time.Minute))
	waitFor(t, "the step's deadline to move by the step", func() bool {
		e.Nudge()
		return openWorkflow(t, st, node).StepDeadline-was.StepDeadline >= (10*time.Minute - time.Second).Microseconds()
	})
	if err := second.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := second.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	stepStillWaits(t, st, e, a, node, was, c, "the database's clock stepped")
}
