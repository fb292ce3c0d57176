package engine

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"bcd/internal/auth"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

func TestReconcileRetry(t *testing.T) {
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{
		{0, 5 * time.Second}, {1, 5 * time.Second}, {2, 10 * time.Second}, {3, 20 * time.Second}, {4, 40 * time.Second},
		{5, 80 * time.Second}, {6, 160 * time.Second}, {7, 5 * time.Minute}, {8, 5 * time.Minute}, {1000, 5 * time.Minute},
	} {
		if got := reconcileRetry(tc.failures); got != tc.want {
			t.Errorf("reconcileRetry(%d) = %s, want %s", tc.failures, got, tc.want)
		}
	}
}

func TestDecideReconcileFailure(t *testing.T) {
	const t0 = int64(1_000_000_000)
	sec := func(s int64) int64 { return t0 + s*1_000_000 }
	run := func(count int, since, raised int64) store.ReconcileFailures {
		return store.ReconcileFailures{Count: count, Since: since, LastError: "before", FaultRaisedAt: raised}
	}
	for _, tc := range []struct {
		name    string
		prev    store.ReconcileFailures
		faulted bool
		at      int64
		want    failureOutcome
	}{
		{"first failure", store.ReconcileFailures{}, false, t0,
			failureOutcome{next: store.ReconcileFailures{Count: 1, Since: t0, LastError: "boom"}, again: 5 * time.Second, first: true}},
		{"second", run(1, t0, 0), false, sec(5),
			failureOutcome{next: store.ReconcileFailures{Count: 2, Since: t0, LastError: "boom"}, again: 10 * time.Second}},
		{"seventh: below the threshold", run(6, t0, 0), false, sec(315),
			failureOutcome{next: store.ReconcileFailures{Count: 7, Since: t0, LastError: "boom"}, again: 5 * time.Minute}},
		{"eighth, over 2 minutes: raise", run(7, t0, 0), false, sec(615),
			failureOutcome{next: store.ReconcileFailures{Count: 8, Since: t0, LastError: "boom"}, again: 5 * time.Minute, raise: true}},
		{"twentieth within a minute (wake-ups): not yet", run(19, t0, 0), false, sec(60),
			failureOutcome{next: store.ReconcileFailures{Count: 20, Since: t0, LastError: "boom"}, again: 5 * time.Minute}},
		{"exactly 2 minutes: raise", run(19, t0, 0), false, sec(120),
			failureOutcome{next: store.ReconcileFailures{Count: 20, Since: t0, LastError: "boom"}, again: 5 * time.Minute, raise: true}},
		{"raised, still faulted: parked", run(8, t0, sec(615)), true, sec(616),
			failureOutcome{next: store.ReconcileFailures{Count: 9, Since: t0, LastError: "boom", FaultRaisedAt: sec(615)}, again: time.Hour}},
		{"raised, cleared by an operator: a new run", run(9, t0, sec(615)), false, sec(5000),
			failureOutcome{next: store.ReconcileFailures{Count: 1, Since: sec(5000), LastError: "boom"}, again: 5 * time.Second, first: true}},
		{"not raised yet (the raise failed), not faulted: raise again", run(8, t0, 0), false, sec(915),
			failureOutcome{next: store.ReconcileFailures{Count: 9, Since: t0, LastError: "boom"}, again: 5 * time.Minute, raise: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideReconcileFailure(tc.prev, tc.faulted, tc.at, "boom"); got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestReconcileFaultOn(t *testing.T) {
	f := store.ReconcileFailures{Count: 8, Since: 1_700_000_000_000_000, LastError: strings.Repeat("x", 2000)}
	for _, tc := range []struct {
		name     string
		v        store.NodeFaultView
		state    string
		from     string
		wantBusy bool
	}{
		{"workflow-driven: fails", store.NodeFaultView{State: "deploying", TargetState: "deployed"}, "failed", "deploying", true},
		{"rescue toward deployed: fails", store.NodeFaultView{State: "rescue", TargetState: "deployed"}, "failed", "rescue", true},
		{"deployed (resting): keeps its state", store.NodeFaultView{State: "deployed"}, "deployed", "", false},
		{"failed already: keeps its state and failed_from", store.NodeFaultView{State: "failed", TargetState: "ready", FailedFrom: "inspecting", Maintenance: true}, "failed", "inspecting", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, busy := reconcileFaultOn(tc.v, f)
			if got.State != tc.state || got.FailedFrom != tc.from || busy != tc.wantBusy || got.FaultCode != "RECONCILE_FAILED" {
				t.Errorf("got %+v busy %v, want state %s from %q busy %v RECONCILE_FAILED", got, busy, tc.state, tc.from, tc.wantBusy)
			}
			if !strings.HasPrefix(got.FaultMsg, "8 reconciliations in a row failed since 2023-11-14T22:13:20Z; the last: xxx") || len(got.FaultMsg) > 1000 {
				t.Errorf("message %q (%d bytes)", got.FaultMsg[:min(len(got.FaultMsg), 120)], len(got.FaultMsg))
			}
			if !strings.HasPrefix(got.MaintenanceReason, "RECONCILE_FAILED: ") {
				t.Errorf("maintenance reason %q", got.MaintenanceReason)
			}
		})
	}
}

func TestReconcileError(t *testing.T) {
	long := strings.Repeat("é", 400) // 800 bytes: the cut falls inside a character
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"short", errors.New("boom"), "boom"},
		{"invalid UTF-8", errors.New("bad \xff byte"), "bad ? byte"},
		{"long: cut at a character", errors.New(long), strings.Repeat("é", 256)},
		{"long, odd offset", errors.New("a" + long), "a" + strings.Repeat("é", 255)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := reconcileError(tc.err)
			if got != tc.want || !utf8.ValidString(got) || len(got) > maxReconcileError {
				t.Errorf("got %q (%d bytes), want %q", got, len(got), tc.want)
			}
		})
	}
}

// failingSchedule is the back-off between the failures of a node that always fails, up to the
// 8th (which raises RECONCILE_FAILED, 10 min 15 s after the first).
var failingSchedule = []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second, 160 * time.Second, 5 * time.Minute}

// failOnce runs the engine once, expecting node id's reconciliation to fail with the injected
// error, and returns the run of failures recorded and how long until the node is due.
func failOnce(t *testing.T, e *Engine, st *store.Store, c *clock, id string) (store.ReconcileFailures, time.Duration) {
	t.Helper()
	ctx := context.Background()
	n, err := e.RunOnce(ctx)
	if n != 1 || err == nil || !strings.Contains(err.Error(), "injected: cannot read the row") {
		t.Fatalf("RunOnce: %d nodes, %v; want 1 failing with the injected error", n, err)
	}
	f, ok, err := st.ReconcileFailuresOf(ctx, id)
	if err != nil || !ok {
		t.Fatalf("failures of %s: %+v %v %v", id, f, ok, err)
	}
	return f, dueIn(t, st, c, id)
}

// dueIn is how long until node id's wake-up row is due.
func dueIn(t *testing.T, st *store.Store, c *clock, id string) time.Duration {
	t.Helper()
	ws, err := st.WakeUps(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.NodeID == id {
			return time.Duration(w.DueAt-c.Now().UnixMicro()) * time.Microsecond
		}
	}
	t.Fatalf("node %s has no wake-up row", id)
	return 0
}

// failUntilFault makes node id fail along failingSchedule, checking the back-off, the count,
// and that nothing runs before the node is due, up to the 8th failure, which raises the fault.
func failUntilFault(t *testing.T, e *Engine, st *store.Store, c *clock, id string, from int) {
	t.Helper()
	for i := from; i < len(failingSchedule)+1; i++ {
		f, due := failOnce(t, e, st, c, id)
		if f.Count != i+1 || !strings.Contains(f.LastError, "injected: cannot read the row") || f.FaultRaisedAt != 0 && i < len(failingSchedule) {
			t.Fatalf("failure %d: recorded %+v", i+1, f)
		}
		if i == len(failingSchedule) {
			return // the 8th: the fault's transaction made the node due at once
		}
		if want := failingSchedule[i]; due != want {
			t.Fatalf("failure %d: due in %s, want %s", i+1, due, want)
		}
		if n := nodeOf(t, st, id); n.Maintenance || n.FaultCode != "" {
			t.Fatalf("failure %d: node in maintenance (%v) or faulted (%q) before the threshold", i+1, n.Maintenance, n.FaultCode)
		}
		c.Add(due - time.Second)
		if n, err := e.RunOnce(context.Background()); n != 0 || err != nil {
			t.Fatalf("failure %d: %d nodes reconciled a second before the node was due (%v)", i+1, n, err)
		}
		c.Add(time.Second)
	}
}

func nodeOf(t *testing.T, st *store.Store, id string) store.Node {
	t.Helper()
	n, err := st.Node(context.Background(), id, "")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func eventsOf(t *testing.T, st *store.Store, id, kind string) []store.Event {
	t.Helper()
	evs, err := st.Events(context.Background(), store.EventFilter{NodeID: id, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var out []store.Event
	for _, e := range evs {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

var injected = errors.New("injected: cannot read the row")

var operator = auth.Principal{Name: "op", Role: auth.Admin}

// A workflow-driven node whose reconciliation always fails is retried at 5 s, 10 s, … 5 min; the
// 8th failure (10 min 15 s after the first) fails it with RECONCILE_FAILED, maintenance on, its
// workflow asked to abort, a node.fail event with the error, and it is listed among the failed
// nodes doctor shows. One more look finds it still failing and parks it for an hour: nothing
// runs meanwhile. Recover clears it: the node reconciles again and its run of failures ends.
func TestReconcileFailingNodeFaults(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newWFFixture(t, st, "rescue", "deployed", []workflow.Step{{Use: "power.getPower"}}, nil, Config{})
		f.e.failing.inject = func(string) error { return injected }
		id := f.node.ID
		t0 := f.clock.Now()
		failUntilFault(t, f.e, st, f.clock, id, 0)

		n := nodeOf(t, st, id)
		if n.State != "failed" || n.FailedFrom != "rescue" || n.TargetState != "deployed" || n.FaultCode != "RECONCILE_FAILED" || !n.Maintenance ||
			!strings.Contains(n.FaultMsg, "injected: cannot read the row") || !strings.HasPrefix(n.MaintenanceReason, "RECONCILE_FAILED") {
			t.Fatalf("after the 8th failure: %s from %s → %s, fault %s %q, maintenance %v %q", n.State, n.FailedFrom, n.TargetState, n.FaultCode, n.FaultMsg, n.Maintenance, n.MaintenanceReason)
		}
		if got := f.clock.Now().Sub(t0); got != 615*time.Second {
			t.Fatalf("the fault came %s after the first failure, want 10m15s", got)
		}
		evs := eventsOf(t, st, id, "node.fail")
		if len(evs) != 1 || evs[0].ToState != "failed" || !strings.Contains(evs[0].Data, "injected: cannot read the row") || !strings.Contains(evs[0].Data, `"failures":8`) {
			t.Fatalf("node.fail events: %+v", evs)
		}
		if wf := f.workflow(t); !wf.AbortRequested {
			t.Fatalf("the workflow was not asked to abort: %+v", wf)
		}
		failed, err := st.FailedInMaintenance(ctx, "", 100)
		if err != nil || len(failed) != 1 || failed[0].ID != id {
			t.Fatalf("doctor's failed nodes: %v %v", failed, err)
		}
		if got, err := st.StrandedNodes(ctx, 100); err != nil || len(got) != 0 {
			t.Fatalf("stranded: %v %v", got, err)
		}
		if due := dueIn(t, st, f.clock, id); due != 0 {
			t.Fatalf("after the fault the node is due in %s, want at once", due)
		}

		// One more look: still failing, now parked.
		rec, due := failOnce(t, f.e, st, f.clock, id)
		if rec.Count != 9 || rec.FaultRaisedAt == 0 || due != time.Hour {
			t.Fatalf("after the fault: %+v, due in %s; want 9 failures, raised, parked for 1h", rec, due)
		}
		f.clock.Add(59 * time.Minute)
		if n, err := f.e.RunOnce(ctx); n != 0 || err != nil {
			t.Fatalf("a parked node was reconciled: %d %v", n, err)
		}
		if got, want := [2]int64{f.e.ReconcileFailures(), f.e.ReconcileFaults()}, [2]int64{9, 1}; got != want {
			t.Fatalf("failures and faults counted: %v, want %v", got, want)
		}
		if len(eventsOf(t, st, id, "node.fail")) != 1 {
			t.Fatal("the fault was raised again while the node still carried it")
		}

		// The operator fixes the cause and recovers the node.
		f.e.failing.inject = nil
		svc := metal.New(st, nil, slog.New(slog.DiscardHandler))
		if _, _, err := svc.Apply(ctx, operator, provision.VerbRecover, metal.VerbInput{Node: id}); err != nil {
			t.Fatal(err)
		}
		if n, err := f.e.RunOnce(ctx); n != 1 || err != nil {
			t.Fatalf("after recover: %d %v", n, err)
		}
		if rec, ok, err := st.ReconcileFailuresOf(ctx, id); err != nil || ok && rec != (store.ReconcileFailures{}) {
			t.Fatalf("after recover the run of failures is %+v (row %v, %v), want none", rec, ok, err)
		}
		if n := nodeOf(t, st, id); n.State != "rescue" || n.Maintenance || n.FaultCode != "" {
			t.Fatalf("after recover: %s, maintenance %v, fault %q", n.State, n.Maintenance, n.FaultCode)
		}
	})
}

// A node that fails a few times and then reconciles has its run of failures ended by the
// statement that ends its lease (here its row stays, due at the step's deadline), and no fault.
func TestReconcileFailuresResetOnSuccess(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newWFFixture(t, st, "rescue", "deployed", []workflow.Step{{Use: "power.getPower"}}, nil, Config{})
		f.e.failing.inject = func(string) error { return injected }
		for i := range 3 {
			rec, due := failOnce(t, f.e, st, f.clock, f.node.ID)
			if rec.Count != i+1 || due != failingSchedule[i] {
				t.Fatalf("failure %d: %+v due in %s", i+1, rec, due)
			}
			f.clock.Add(due)
		}
		f.e.failing.inject = nil
		f.run(t)
		rec, ok, err := st.ReconcileFailuresOf(ctx, f.node.ID)
		if err != nil || !ok || rec != (store.ReconcileFailures{}) {
			t.Fatalf("after a success: %+v, row %v, %v; want the row (the step's deadline) with no failures", rec, ok, err)
		}
		if n := nodeOf(t, st, f.node.ID); n.Maintenance || n.FaultCode != "" || n.State != "rescue" {
			t.Fatalf("node %s, maintenance %v, fault %q", n.State, n.Maintenance, n.FaultCode)
		}
		if len(f.commands(t, "bmc.power")) == 0 && len(f.commands(t, "")) == 0 {
			t.Fatal("the successful reconciliation queued no command")
		}
		// A failure now begins a new run.
		f.e.failing.inject = func(string) error { return injected }
		f.clock.Add(dueIn(t, st, f.clock, f.node.ID))
		if rec, _ := failOnce(t, f.e, st, f.clock, f.node.ID); rec.Count != 1 {
			t.Fatalf("a failure after a success: %+v, want a run of 1", rec)
		}
	})
}

// The run of failures is on the store: a server started again (a new engine on the store
// opened again) goes on counting where the last one stopped, and faults at the same 8th failure.
func TestReconcileFailuresSurviveRestart(t *testing.T) {
	for _, eng := range storetest.Engines {
		t.Run(string(eng), func(t *testing.T) {
			ctx := context.Background()
			dsn := storetest.DSN(t, eng)
			st, err := store.Open(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			f := newWFFixture(t, st, "rescue", "deployed", []workflow.Step{{Use: "power.getPower"}}, nil, Config{})
			f.e.failing.inject = func(string) error { return injected }
			for range 3 {
				_, due := failOnce(t, f.e, st, f.clock, f.node.ID)
				f.clock.Add(due)
			}
			st.Close()

			st2, err := store.Open(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer st2.Close()
			st2.SetClock(f.clock.Now)
			e2 := New(st2, nil, nil, Config{})
			e2.failing.inject = func(string) error { return injected }
			rec, due := failOnce(t, e2, st2, f.clock, f.node.ID)
			if rec.Count != 4 || due != failingSchedule[3] {
				t.Fatalf("after the restart: %+v due in %s; want the 4th failure, due in %s", rec, due, failingSchedule[3])
			}
			f.clock.Add(due)
			failUntilFault(t, e2, st2, f.clock, f.node.ID, 4)
			if n := nodeOf(t, st2, f.node.ID); n.FaultCode != "RECONCILE_FAILED" || n.State != "failed" {
				t.Fatalf("after the 8th failure across the restart: %s %q", n.State, n.FaultCode)
			}
		})
	}
}

// seedResting enrolls a deployed node (no workflow) and wakes it.
func seedResting(t *testing.T, st *store.Store, c *clock) store.Node {
	t.Helper()
	ctx := context.Background()
	var n store.Node
	err := st.Write(ctx, func(tx *store.Tx) error {
		var err error
		if n, err = insertTestNode(ctx, tx, c, "deployed", ""); err != nil {
			return err
		}
		return tx.Wake(ctx, n.ID, "test", 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A resting (deployed) node that keeps failing keeps its state: RECONCILE_FAILED, maintenance on,
// a node.fault event. Maintenance off (the operator's way back for a resting node) wakes it; a
// failure then begins a new run (no fault at once), and the first success clears the fault.
func TestReconcileFailingRestingNode(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		st.SetClock(c.Now)
		n := seedResting(t, st, c)
		e := New(st, nil, nil, Config{})
		e.failing.inject = func(string) error { return injected }
		failUntilFault(t, e, st, c, n.ID, 0)
		got := nodeOf(t, st, n.ID)
		if got.State != "deployed" || got.FaultCode != "RECONCILE_FAILED" || !got.Maintenance {
			t.Fatalf("after the 8th failure: %s, fault %q, maintenance %v", got.State, got.FaultCode, got.Maintenance)
		}
		if evs := eventsOf(t, st, n.ID, "node.fault"); len(evs) != 1 || !strings.Contains(evs[0].Data, "injected") {
			t.Fatalf("node.fault events: %+v", evs)
		}
		// bcd doctor lists it with the failed nodes waiting for an operator, though it rests.
		waiting, err := st.FailedInMaintenance(ctx, "", 100)
		if err != nil || len(waiting) != 1 || waiting[0].ID != n.ID || waiting[0].FaultCode != "RECONCILE_FAILED" {
			t.Fatalf("doctor's nodes waiting in maintenance: %+v %v", waiting, err)
		}
		failOnce(t, e, st, c, n.ID) // the last look: parked

		svc := metal.New(st, nil, slog.New(slog.DiscardHandler))
		if _, _, err := svc.Apply(ctx, operator, provision.VerbMaintenance, metal.VerbInput{Node: n.ID, MaintenanceOn: false}); err != nil {
			t.Fatal(err)
		}
		rec, due := failOnce(t, e, st, c, n.ID)
		if rec.Count != 1 || rec.FaultRaisedAt != 0 || due != 5*time.Second {
			t.Fatalf("a failure after maintenance off: %+v due in %s; want a new run of 1, due in 5s", rec, due)
		}
		if got := nodeOf(t, st, n.ID); got.Maintenance {
			t.Fatal("a failure after maintenance off put the node back in maintenance at once")
		}
		e.failing.inject = nil
		c.Add(due)
		if k, err := e.RunOnce(ctx); k != 1 || err != nil {
			t.Fatalf("%d %v", k, err)
		}
		if got := nodeOf(t, st, n.ID); got.FaultCode != "" || got.FaultMsg != "" || got.Maintenance {
			t.Fatalf("after a success: fault %q %q, maintenance %v", got.FaultCode, got.FaultMsg, got.Maintenance)
		}
		if evs := eventsOf(t, st, n.ID, "node.fault_cleared"); len(evs) != 1 {
			t.Fatalf("node.fault_cleared events: %+v", evs)
		}
		if _, ok, err := st.ReconcileFailuresOf(ctx, n.ID); ok || err != nil {
			t.Fatalf("the wake-up row stayed (%v, %v)", ok, err)
		}
	})
}
