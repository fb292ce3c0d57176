package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// Migration 00038 adds the run of failed reconciliations to the wake-up rows a store holds (none
// failing), its Down removes it, and it applies again after that.
func TestReconcileFailuresMigration(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			ctx := context.Background()
			_, db, p := migrationProvider(t, e)
			if _, err := p.UpTo(ctx, 37); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `INSERT INTO reconcile_queue (node_id, due_at, reason, enqueued_at, seq) VALUES ('n1', 5, 'r', 1, 2)`); err != nil {
				t.Fatal(err)
			}
			read := func() (int, int64, string, int64, error) {
				var n int
				var since, raised int64
				var last string
				err := db.QueryRowContext(ctx, `SELECT failures, failing_since, last_error, fault_raised_at FROM reconcile_queue WHERE node_id = 'n1'`).Scan(&n, &since, &last, &raised)
				return n, since, last, raised, err
			}
			for _, s := range []struct {
				name    string
				run     func() error
				columns bool
			}{
				{"up", func() error { _, err := p.UpTo(ctx, 38); return err }, true},
				{"down", func() error { _, err := p.DownTo(ctx, 37); return err }, false},
				{"up again", func() error { _, err := p.UpTo(ctx, 38); return err }, true},
			} {
				if err := s.run(); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				n, since, last, raised, err := read()
				if !s.columns {
					if err == nil {
						t.Fatalf("after %s the columns are still there", s.name)
					}
					continue
				}
				if err != nil || n != 0 || since != 0 || last != "" || raised != 0 {
					t.Fatalf("after %s: %d %d %q %d %v; want a row with no failures", s.name, n, since, last, raised, err)
				}
			}
			var seq, due int64
			if err := db.QueryRowContext(ctx, `SELECT seq, due_at FROM reconcile_queue WHERE node_id = 'n1'`).Scan(&seq, &due); err != nil || seq != 2 || due != 5 {
				t.Fatalf("the row's other columns: seq %d due %d %v", seq, due, err)
			}
		})
	}
}

// A failure is recorded on the leased row alone and kept across wake-ups; every way a
// successful reconciliation ends its lease (due again at a deadline, released because woken
// meanwhile, deleted) ends the run; a lease another server took over is theirs.
func TestReconcileFailuresOnWakeUpRow(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		st.SetClock(func() time.Time { return now })
		_, nodes := seed(t, st)
		id := nodes[0].ID
		write := func(f func(tx *store.Tx) error) {
			t.Helper()
			if err := st.Write(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
		claim := func(owner string) store.Lease {
			t.Helper()
			ls, err := st.ClaimWakeUps(ctx, owner, 10*time.Second, 10)
			if err != nil || len(ls) != 1 || ls[0].NodeID != id {
				t.Fatalf("claim by %s: %+v %v", owner, ls, err)
			}
			return ls[0]
		}
		failures := func() (store.ReconcileFailures, bool) {
			t.Helper()
			f, ok, err := st.ReconcileFailuresOf(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return f, ok
		}
		run := store.ReconcileFailures{Count: 3, Since: now.UnixMicro() - 1, LastError: "boom: é", FaultRaisedAt: 0}

		write(func(tx *store.Tx) error { return tx.Wake(ctx, id, "test", 0) })
		l := claim("a")
		write(func(tx *store.Tx) error {
			f, held, err := tx.LeasedReconcileFailures(ctx, l, "b")
			if err != nil || held || f != (store.ReconcileFailures{}) {
				t.Errorf("read by a server not holding the lease: %+v %v %v", f, held, err)
			}
			// Another server's record on a row it does not hold changes nothing.
			if err := tx.RecordReconcileFailure(ctx, l, "b", store.ReconcileFailures{Count: 99}, time.Hour); err != nil {
				return err
			}
			f, held, err = tx.LeasedReconcileFailures(ctx, l, "a")
			if err != nil || !held || f != (store.ReconcileFailures{}) {
				t.Errorf("read by the holder: %+v %v %v", f, held, err)
			}
			return tx.RecordReconcileFailure(ctx, l, "a", run, 20*time.Second)
		})
		if f, ok := failures(); !ok || f != run {
			t.Fatalf("recorded %+v (%v), want %+v", f, ok, run)
		}
		ws, err := st.WakeUps(ctx, 10)
		if err != nil || len(ws) != 1 || ws[0].DueAt != now.Add(20*time.Second).UnixMicro() {
			t.Fatalf("wake-ups after the failure: %+v %v", ws, err)
		}
		// A wake-up makes it due at once and keeps the run; so does the raise's mark.
		write(func(tx *store.Tx) error {
			if err := tx.MarkReconcileFaultRaised(ctx, id); err != nil {
				return err
			}
			return tx.Wake(ctx, id, "woken", 0)
		})
		raised := run
		raised.FaultRaisedAt = now.UnixMicro()
		if f, _ := failures(); f != raised {
			t.Fatalf("after a wake-up: %+v, want %+v", f, raised)
		}

		// Success, due again at a deadline: the row stays, the run ends.
		l = claim("a")
		write(func(tx *store.Tx) error { return tx.FinishWakeUp(ctx, l, "a", time.Minute) })
		if f, ok := failures(); !ok || f != (store.ReconcileFailures{}) {
			t.Fatalf("after a success with a deadline: %+v (%v)", f, ok)
		}

		// Success of a node woken while leased: released, the run ends.
		now = now.Add(time.Minute)
		l = claim("a")
		write(func(tx *store.Tx) error { return tx.RecordReconcileFailure(ctx, l, "a", run, 0) })
		l = claim("a")
		write(func(tx *store.Tx) error { return tx.Wake(ctx, id, "woken while leased", 0) })
		write(func(tx *store.Tx) error { return tx.FinishWakeUp(ctx, l, "a", 0) })
		if f, ok := failures(); !ok || f != (store.ReconcileFailures{}) {
			t.Fatalf("after a success released for a wake-up: %+v (%v)", f, ok)
		}

		// Success with nothing to wait for: the row, and the run, go.
		l = claim("a")
		write(func(tx *store.Tx) error { return tx.RecordReconcileFailure(ctx, l, "a", run, 0) })
		l = claim("a")
		write(func(tx *store.Tx) error { return tx.FinishWakeUp(ctx, l, "a", 0) })
		if f, ok := failures(); ok {
			t.Fatalf("after a success the row stayed: %+v", f)
		}
	})
}

// The fault view reads and the fault writes a node's few columns alone, bumping its version and
// keeping its target.
func TestNodeFault(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		n := nodes[1]
		err := st.Write(ctx, func(tx *store.Tx) error {
			v, err := tx.LockNodeFaultView(ctx, n.ID)
			if err != nil {
				return err
			}
			if want := (store.NodeFaultView{ID: n.ID, TenantID: n.TenantID, State: "enrolling", TargetState: "ready"}); v != want {
				t.Errorf("view %+v, want %+v", v, want)
			}
			if _, err := tx.LockNodeFaultView(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("a missing node: %v, want ErrNotFound", err)
			}
			return tx.SetNodeFault(ctx, n.ID, store.NodeFault{State: "failed", FailedFrom: "enrolling", FaultCode: "RECONCILE_FAILED", FaultMsg: "boom", MaintenanceReason: "RECONCILE_FAILED: 8"})
		})
		if err != nil {
			t.Fatal(err)
		}
		got, err := st.Node(ctx, n.ID, "")
		if err != nil {
			t.Fatal(err)
		}
		if got.State != "failed" || got.FailedFrom != "enrolling" || got.TargetState != "ready" || got.FaultCode != "RECONCILE_FAILED" || got.FaultMsg != "boom" ||
			!got.Maintenance || got.MaintenanceReason != "RECONCILE_FAILED: 8" || got.Version != n.Version+1 || got.Name != n.Name {
			t.Fatalf("after the fault: %+v (version %d before)", got, n.Version)
		}
	})
}

// A reconciliation that succeeds outside a lease (an agent's report, reconciled in its own
// transaction) and replaces the node's wake-up row ends the run of failures on it, as a
// leased one's FinishWakeUp does: a later failure starts a new run.
func TestSetWakeUpEndsTheRunOfFailures(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		id := nodes[0].ID
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.Wake(ctx, id, "test", 0) }); err != nil {
			t.Fatal(err)
		}
		ls, err := st.ClaimWakeUps(ctx, "a", 10*time.Second, 10)
		if err != nil || len(ls) != 1 {
			t.Fatalf("claim: %+v %v", ls, err)
		}
		run := store.ReconcileFailures{Count: 5, Since: 1, LastError: "boom"}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.RecordReconcileFailure(ctx, ls[0], "a", run, time.Minute) }); err != nil {
			t.Fatal(err)
		}
		if f, _, err := st.ReconcileFailuresOf(ctx, id); err != nil || f != run {
			t.Fatalf("recorded %+v %v, want %+v", f, err, run)
		}
		for _, seq := range []int64{-1, 1} {
			if err := st.Write(ctx, func(tx *store.Tx) error {
				// The run again (the first pass ended it), on the row as a failure leaves it.
				if _, err := tx.ExecForTests(ctx, `UPDATE reconcile_queue SET failures = ?, failing_since = ?, last_error = ? WHERE node_id = ?`,
					run.Count, run.Since, run.LastError, id); err != nil {
					return err
				}
				cur, err := tx.WakeUpSeq(ctx, id)
				if err != nil {
					return err
				}
				if seq > 0 {
					seq = cur
				}
				return tx.SetWakeUp(ctx, id, "deadline", 30*time.Second, seq)
			}); err != nil {
				t.Fatal(err)
			}
			f, ok, err := st.ReconcileFailuresOf(ctx, id)
			if err != nil || !ok || f != (store.ReconcileFailures{}) {
				t.Fatalf("seq %d: after a success outside a lease: %+v (row %v) %v, want no run", seq, f, ok, err)
			}
		}
	})
}
