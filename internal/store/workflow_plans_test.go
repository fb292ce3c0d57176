package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A workflow's steps and cleanup are kept once per plan (workflow_plans): workflows of the same
// plan share its row, each reads back its own, an insert on a plan unused for an hour marks it
// used, and history retention deletes a plan once no workflow names it, never one a workflow
// still names or began on lately.
func TestWorkflowPlans(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		n := nodes[0]
		const (
			steps1   = `[{"use":"power.on","timeout":60000000000}]`
			steps2   = `[{"use":"power.off","timeout":60000000000}]`
			cleanup1 = `[{"use":"boot.cleanUp"}]`
		)
		insert := func(steps, cleanup string, ended bool) store.Workflow {
			t.Helper()
			w := store.Workflow{NodeID: n.ID, TenantID: n.TenantID, Profile: "p", Owner: "metal", NodeState: "inspecting",
				Steps: steps, Cleanup: cleanup, State: "running", Phase: "steps"}
			if ended {
				w.State, w.Phase, w.FinishedAt, w.OutcomeApplied = "succeeded", "done", 100, true
			}
			if err := st.Write(ctx, func(tx *store.Tx) error { return tx.InsertWorkflow(ctx, &w) }); err != nil {
				t.Fatal(err)
			}
			return w
		}
		count := func(q string, args ...any) int64 {
			t.Helper()
			var v int64
			if err := st.Write(ctx, func(tx *store.Tx) (err error) { v, err = tx.QueryIntForTests(ctx, q, args...); return err }); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
			return v
		}
		exec := func(q string, args ...any) {
			t.Helper()
			if err := st.Write(ctx, func(tx *store.Tx) error { _, err := tx.ExecForTests(ctx, q, args...); return err }); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}

		a := insert(steps1, cleanup1, true)
		b := insert(steps1, cleanup1, true)
		c := insert(steps2, cleanup1, true)
		if got := count(`SELECT COUNT(*) FROM workflow_plans`); got != 2 {
			t.Errorf("three workflows of two plans left %d plans", got)
		}
		read, err := st.Workflows(ctx, n.ID, 10)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string][2]string{a.ID: {steps1, cleanup1}, b.ID: {steps1, cleanup1}, c.ID: {steps2, cleanup1}}
		if len(read) != len(want) {
			t.Fatalf("read %d workflows, want %d", len(read), len(want))
		}
		for _, w := range read {
			if got := [2]string{w.Steps, w.Cleanup}; got != want[w.ID] {
				t.Errorf("workflow %s reads back steps and cleanup %q, want %q", w.ID, got, want[w.ID])
			}
		}

		// A plan last used long ago is marked used again; one used 10 minutes ago is left.
		now := time.Now().UnixMicro()
		tenMinutesAgo := now - int64(10*time.Minute/time.Microsecond)
		exec(`UPDATE workflow_plans SET used_at = ? WHERE steps = ?`, 1, steps1)
		exec(`UPDATE workflow_plans SET used_at = ? WHERE steps = ?`, tenMinutesAgo, steps2)
		open := insert(steps1, cleanup1, false)
		insert(steps2, cleanup1, true)
		if got := count(`SELECT used_at FROM workflow_plans WHERE steps = ?`, steps1); got < now {
			t.Errorf("a plan unused since 1 still says used at %d after a workflow began on it (at or after %d)", got, now)
		}
		if got := count(`SELECT used_at FROM workflow_plans WHERE steps = ?`, steps2); got != tenMinutesAgo {
			t.Errorf("a plan used 10 minutes ago was rewritten to %d", got)
		}

		// Retention: the ended workflows go. steps1's plan stays (the open workflow names it),
		// steps2's stays while it was used lately (even under a retention that ends now), and
		// goes once it was not.
		purge := func(before int64) store.Purged {
			t.Helper()
			var p store.Purged
			if err := st.Write(ctx, func(tx *store.Tx) (err error) { p, err = tx.PurgeHistory(ctx, before, 100, 0, 0); return err }); err != nil {
				t.Fatal(err)
			}
			return p
		}
		exec(`UPDATE workflow_plans SET used_at = ?`, 1)
		exec(`UPDATE workflow_plans SET used_at = ? WHERE steps = ?`, tenMinutesAgo, steps2)
		if p := purge(time.Now().UnixMicro()); p.Workflows != 4 || p.Plans != 0 {
			t.Errorf("purge deleted %d workflows and %d plans, want 4 and 0 (one plan named, one used lately)", p.Workflows, p.Plans)
		}
		exec(`UPDATE workflow_plans SET used_at = ?`, 1)
		if p := purge(1000); p.Plans != 1 {
			t.Errorf("purge deleted %d plans, want steps2's alone", p.Plans)
		}
		if got := count(`SELECT COUNT(*) FROM workflow_plans WHERE steps = ?`, steps1); got != 1 {
			t.Errorf("the open workflow's plan was purged")
		}
		read, err = st.Workflows(ctx, n.ID, 10)
		if err != nil || len(read) != 1 || read[0].ID != open.ID || read[0].Steps != steps1 {
			t.Errorf("after the purge the node's workflows read %+v, %v; want the open one with its steps", read, err)
		}
	})
}

// TestWorkflowPlansMigration: migration 00049 rewrites no stored workflow: each keeps its steps
// and cleanup in its row and reads them from there, beside a workflow begun since on a plan;
// its Down puts a plan's steps and cleanup back into the rows of its workflows.
func TestWorkflowPlansMigration(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			ctx := context.Background()
			dsn, db, p := migrationProvider(t, e)
			if _, err := p.UpTo(ctx, 48); err != nil {
				t.Fatal(err)
			}
			for _, w := range [][3]string{{"w1", "[1]", "[c]"}, {"w2", "[2]", "[c]"}} {
				if _, err := db.ExecContext(ctx, `INSERT INTO workflows (id, node_id, tenant_id, profile, owner, node_state, steps, cleanup, command_kinds, state, phase, created_at, updated_at)
					VALUES ($1, 'n1', 't', 'p', 'metal', '', $2, $3, '[]', 'running', 'steps', 5, 5)`, w[0], w[1], w[2]); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := p.UpTo(ctx, 49); err != nil {
				t.Fatal(err)
			}

			// The store reads each workflow with its steps, and keeps a new one's in a plan.
			st, err := store.Open(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			w3 := store.Workflow{NodeID: "n1", TenantID: "t", Profile: "p", Owner: "metal", Steps: "[3]", Cleanup: "[c]", State: "running", Phase: "steps"}
			if err := st.Write(ctx, func(tx *store.Tx) error { return tx.InsertWorkflow(ctx, &w3) }); err != nil {
				t.Fatal(err)
			}
			ws, err := st.Workflows(ctx, "n1", 10)
			if err != nil || len(ws) != 3 {
				t.Fatalf("read %+v, %v", ws, err)
			}
			for _, w := range ws {
				if want := map[string]string{"w1": "[1]", "w2": "[2]", w3.ID: "[3]"}[w.ID]; w.Steps != want || w.Cleanup != "[c]" {
					t.Errorf("workflow %s reads steps %q and cleanup %q, want %q and [c]", w.ID, w.Steps, w.Cleanup, want)
				}
			}
			st.Close()
			var inRow string
			if err := db.QueryRowContext(ctx, `SELECT steps || cleanup FROM workflows WHERE id = $1`, w3.ID).Scan(&inRow); err != nil || inRow != "" {
				t.Errorf("a new workflow's row holds steps and cleanup %q (%v), want none", inRow, err)
			}

			if _, err := p.DownTo(ctx, 48); err != nil {
				t.Fatal(err)
			}
			rows, err := db.QueryContext(ctx, `SELECT id, steps, cleanup FROM workflows ORDER BY id`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var got []string
			for rows.Next() {
				var id, steps, cleanup string
				if err := rows.Scan(&id, &steps, &cleanup); err != nil {
					t.Fatal(err)
				}
				got = append(got, steps+" "+cleanup)
			}
			if slices.Sort(got); !slices.Equal(got, []string{"[1] [c]", "[2] [c]", "[3] [c]"}) {
				t.Errorf("after 00049's Down the workflows hold %q", got)
			}
		})
	}
}

// On PostgreSQL a purge that reads a plan as unused while a workflow begins on it in another
// transaction waits for that transaction and leaves the plan: the workflow's start touches a
// plan last used long ago (touchPlanQuery), and its row lock holds the purge's delete, which
// then finds the plan used.
func TestPurgeWaitsForAWorkflowBegunOnItsPlan(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.Postgres)
	db, err := sql.Open("pgx", os.Getenv(storetest.EnvPostgresDSN))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	_, nodes := seed(t, st)
	n := nodes[0]
	const steps = `[{"use":"power.on"}]`
	workflow := func(ended bool) store.Workflow {
		w := store.Workflow{NodeID: n.ID, TenantID: n.TenantID, Profile: "p", Owner: "metal", Steps: steps, Cleanup: "[]", State: "running", Phase: "steps"}
		if ended {
			w.State, w.Phase, w.FinishedAt, w.OutcomeApplied = "succeeded", "done", 100, true
		}
		return w
	}
	// The plan's only workflow ended long ago, and the plan was last used long ago.
	old := workflow(true)
	if err := st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.InsertWorkflow(ctx, &old); err != nil {
			return err
		}
		_, err := tx.ExecForTests(ctx, `UPDATE workflow_plans SET used_at = 1`)
		return err
	}); err != nil {
		t.Fatal(err)
	}

	// A workflow begins on the plan and its transaction stays open.
	began, release := make(chan int, 1), make(chan struct{})
	t.Cleanup(sync.OnceFunc(func() { close(release) })) // (a failure leaves it waiting otherwise)
	fresh := workflow(false)
	wrote := make(chan error, 1)
	go func() {
		wrote <- st.Write(ctx, func(tx *store.Tx) error {
			if err := tx.InsertWorkflow(ctx, &fresh); err != nil {
				return err
			}
			pid, err := tx.QueryIntForTests(ctx, `SELECT pg_backend_pid()`) // (sends the held writes)
			if err != nil {
				return err
			}
			began <- int(pid)
			<-release
			return nil
		})
	}()
	var holder int
	select {
	case holder = <-began:
	case err := <-wrote:
		t.Fatalf("the workflow's transaction ended early: %v", err)
	}

	// The purge deletes the old workflow, reads the plan as unused and waits for its row.
	purged := make(chan store.Purged, 1)
	purgeErr := make(chan error, 1)
	go func() {
		var p store.Purged
		err := st.Write(ctx, func(tx *store.Tx) (err error) { p, err = tx.PurgeHistory(ctx, 1000, 100, 0, 0); return err })
		purged <- p
		purgeErr <- err
	}()
	storetest.AwaitBlocked(t, db, holder, func() error {
		select {
		case p := <-purged:
			return fmt.Errorf("the purge ended while the workflow's transaction was open: %+v, %v", p, <-purgeErr)
		default:
			return nil
		}
	})
	release <- struct{}{}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	p, err := <-purged, <-purgeErr
	if err != nil || p.Workflows != 1 || p.Plans != 0 {
		t.Fatalf("purge deleted %d workflows and %d plans (%v), want the old workflow alone", p.Workflows, p.Plans, err)
	}
	ws, err := st.Workflows(ctx, n.ID, 10)
	if err != nil || len(ws) != 1 || ws[0].ID != fresh.ID || ws[0].Steps != steps {
		t.Fatalf("the node's workflows read %+v, %v; want the new one with its steps", ws, err)
	}
}
