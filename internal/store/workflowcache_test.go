package store

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// SQLite's writer keeps each node's open workflow as it read or wrote it (workflowCache).
// Whatever changes the workflows, what a transaction reads through the cache (OpenWorkflow) is
// what the database holds: after each step the two are compared, the database read by a reader
// connection, which has no cache.
func TestWriterCacheHoldsWhatTheDatabaseHolds(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	var node, other Node
	var wf Workflow
	if err := s.Write(ctx, func(tx *Tx) error {
		pool, err := seedPool(ctx, tx)
		if err != nil {
			return err
		}
		node, other = redfishNode(pool, "n", "enrolling"), redfishNode(pool, "o", "enrolling")
		if err := tx.InsertNode(ctx, &node); err != nil {
			return err
		}
		if err := tx.InsertNode(ctx, &other); err != nil {
			return err
		}
		wf = Workflow{NodeID: node.ID, TenantID: pool.TenantID, Profile: "p", Owner: "metal", Steps: `[{"name":"a"}]`, Cleanup: "[]", State: "running",
			Phase: "steps", CommandKinds: []string{"power.on"}}
		return tx.InsertWorkflow(ctx, &wf)
	}); err != nil {
		t.Fatal(err)
	}
	// cached reads the node's open workflow in a write, twice (the second from the cache).
	cached := func() (Workflow, bool) {
		t.Helper()
		var w Workflow
		var open bool
		if err := s.Write(ctx, func(tx *Tx) error {
			for range 2 {
				var err error
				if w, open, err = tx.OpenWorkflow(ctx, node.ID); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return w, open
	}
	stored := func() (Workflow, bool) {
		t.Helper()
		w, open, err := scanOpenWorkflow(s.queryRow(ctx, openWorkflowQuery, node.ID, false), node.ID)
		if err != nil {
			t.Fatal(err)
		}
		return w, open
	}
	open := func(tx *Tx) (Workflow, error) {
		w, ok, err := tx.OpenWorkflow(ctx, node.ID)
		if err == nil && !ok {
			err = errors.New("no open workflow")
		}
		return w, err
	}
	// end ends the node's open workflow, its outcome applied.
	end := func(state string) func(tx *Tx) error {
		return func(tx *Tx) error {
			w, err := open(tx)
			if err != nil {
				return err
			}
			w.State, w.OutcomeApplied, w.FinishedAt = state, true, tx.at
			return tx.UpdateWorkflow(ctx, &w)
		}
	}
	errUndone := errors.New("undone")
	steps := []struct {
		name  string
		write func(tx *Tx) error
		// fails: the write returns an error (its writes are undone).
		fails bool
	}{
		{"nothing changed", func(tx *Tx) error { return nil }, false},
		{"a workflow's step moves on", func(tx *Tx) error {
			w, err := open(tx)
			if err != nil {
				return err
			}
			w.StepIndex, w.StepAttempt, w.CurrentCommand, w.StepDeadline, w.AbortRequested, w.Error = 2, 1, "c1", 123, true, "e"
			return tx.UpdateWorkflow(ctx, &w)
		}, false},
		{"another statement sets a workflow's batch", func(tx *Tx) error {
			_, err := tx.exec(ctx, `UPDATE workflows SET batch_id = ? WHERE node_id = ?`, "b9", node.ID)
			return err
		}, false},
		{"a step, then the write fails", func(tx *Tx) error {
			w, err := open(tx)
			if err != nil {
				return err
			}
			w.StepIndex = 5
			if err := tx.UpdateWorkflow(ctx, &w); err != nil {
				return err
			}
			if _, err := open(tx); err != nil {
				return err
			}
			return errUndone
		}, true},
		{"the workflow ends, its outcome applied", end("succeeded"), false},
		{"a workflow opens for a node cached with none", func(tx *Tx) error {
			w := Workflow{NodeID: node.ID, TenantID: node.TenantID, Profile: "q", Owner: "metal", Steps: "[]", Cleanup: "[]", State: "running", Phase: "steps"}
			return tx.InsertWorkflow(ctx, &w)
		}, false},
		{"the new workflow ends", end("failed"), false},
		{"a statement inserts a workflow for a node cached with none", func(tx *Tx) error {
			_, err := tx.exec(ctx, `INSERT INTO workflows (id, node_id, tenant_id, profile, owner, node_state, steps, cleanup, command_kinds, state, phase, created_at, updated_at)
				VALUES ('w-raw', ?, ?, 'r', 'metal', '', '[]', '[]', '[]', 'running', 'steps', 1, 1)`, node.ID, node.TenantID)
			return err
		}, false},
		{"a closed workflow the cache does not know opens again", func(tx *Tx) error {
			clear(tx.rows().wfNodes)
			_, err := tx.exec(ctx, `UPDATE workflows SET outcome_applied = ?, finished_at = 0 WHERE id = ?`, false, wf.ID)
			return err
		}, false},
		{"an abort requested by a statement of many workflows", func(tx *Tx) error {
			_, err := tx.exec(ctx, `UPDATE workflows SET abort_requested = ? WHERE tenant_id = ?`, true, node.TenantID)
			return err
		}, false},
		{"another connection changes the workflow", nil, false},
	}
	for _, st := range steps {
		cached() // (the workflow as it was, in the cache)
		if st.write != nil {
			if err := s.Write(ctx, st.write); st.fails != (err != nil) {
				t.Fatalf("%s: write returned %v", st.name, err)
			}
		} else if _, err := s.write.ExecContext(ctx, `UPDATE workflows SET phase = 'elsewhere' WHERE node_id = ?`, node.ID); err != nil {
			t.Fatal(err)
		}
		cw, copen := cached()
		sw, sopen := stored()
		if copen != sopen || !reflect.DeepEqual(cw, sw) {
			t.Errorf("%s: the writer reads open workflow (%v)\n%+v\nthe database holds (%v)\n%+v", st.name, copen, cw, sopen, sw)
		}
	}
	if w := s.WriterStats(); w.CacheHits == 0 || w.CacheHits >= w.CachedReads {
		t.Errorf("cache: %d hits of %d reads: want some, not all", w.CacheHits, w.CachedReads)
	}
	// A copy: changing what a read returned changes nothing cached.
	if err := s.Write(ctx, func(tx *Tx) error {
		w, err := open(tx)
		if err != nil {
			return err
		}
		w.CommandKinds[0] = "changed"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if cw, _ := cached(); len(cw.CommandKinds) == 0 || cw.CommandKinds[0] != "power.on" {
		t.Errorf("a caller's change to a workflow it read reached the cache: %v", cw.CommandKinds)
	}
	// A workflow's node never changes.
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.exec(ctx, `UPDATE workflows SET node_id = ? WHERE node_id = ?`, other.ID, node.ID)
		return err
	}); err == nil || !strings.Contains(err.Error(), "never changes") {
		t.Errorf("a workflow moved to another node: %v, want refused", err)
	}
}

// A statement that changes more workflows than the hook's log holds empties the cache: the
// node's open workflow, changed last, is read again.
func TestWriterCacheOfManyChangesAtOnce(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	var node Node
	if err := s.Write(ctx, func(tx *Tx) error {
		pool, err := seedPool(ctx, tx)
		if err != nil {
			return err
		}
		node = redfishNode(pool, "n", "enrolling")
		other := redfishNode(pool, "o", "enrolling")
		for _, n := range []*Node{&node, &other} {
			if err := tx.InsertNode(ctx, n); err != nil {
				return err
			}
		}
		for i := range logCap + 10 {
			w := Workflow{NodeID: other.ID, TenantID: pool.TenantID, Profile: "p", Owner: "metal", Steps: "[]", Cleanup: "[]", State: "succeeded",
				Phase: "steps", OutcomeApplied: true, FinishedAt: int64(i + 1)}
			if err := tx.InsertWorkflow(ctx, &w); err != nil {
				return err
			}
		}
		w := Workflow{NodeID: node.ID, TenantID: pool.TenantID, Profile: "p", Owner: "metal", Steps: "[]", Cleanup: "[]", State: "running", Phase: "steps"}
		return tx.InsertWorkflow(ctx, &w)
	}); err != nil {
		t.Fatal(err)
	}
	read := func() (w Workflow) {
		t.Helper()
		if err := s.Write(ctx, func(tx *Tx) error {
			var err error
			w, _, err = tx.OpenWorkflow(ctx, node.ID)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return w
	}
	read()
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.exec(ctx, `UPDATE workflows SET abort_requested = ?`, true)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if w := read(); !w.AbortRequested {
		t.Errorf("the writer reads the open workflow as before a statement that changed %d workflows", logCap+11)
	}
}

// A workflow opened for a node whose open workflow the cache does not know (its last one just
// ended, and left the cache) is cached as its node's open one when the node has no other: the
// next report on the node reads nothing.
func TestWriterCachesAWorkflowOpenedForANodeItDidNotKnow(t *testing.T) {
	ctx := context.Background()
	s, node := openWithNode(t)
	// insert opens a workflow of profile p for the node, the cache emptied first, and returns
	// what the cache then holds of the node.
	insert := func(p string) (cachedWorkflow, bool) {
		t.Helper()
		var c cachedWorkflow
		var ok bool
		if err := s.Write(ctx, func(tx *Tx) error {
			tx.rows().clear()
			w := Workflow{NodeID: node.ID, TenantID: node.TenantID, Profile: p, Owner: "metal", Steps: `[{"name":"a"}]`, Cleanup: "[]", State: "running",
				Phase: "steps", CommandKinds: []string{"power.on"}}
			if err := tx.InsertWorkflow(ctx, &w); err != nil {
				return err
			}
			c, ok = tx.rows().peekWorkflow(node.ID)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return c, ok
	}
	c, ok := insert("first")
	stored, open, err := scanOpenWorkflow(s.queryRow(ctx, openWorkflowQuery, node.ID, false), node.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || !c.ok || !open || !reflect.DeepEqual(c.w, stored) {
		t.Errorf("a node with no other open workflow: cached %v (open %v)\n%+v\nthe database holds (%v)\n%+v", ok, c.ok, c.w, open, stored)
	}
	// Another, with the first still open: the cache does not guess which a read returns.
	if _, ok := insert("second"); ok {
		t.Error("a node with another open workflow: the new one was cached")
	}
}
