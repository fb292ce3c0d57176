package store

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// SQLite's writer keeps the nodes and open workflows it read or wrote (rowCache). Whatever
// changes them, what a transaction reads through the cache (LockNode, OpenWorkflow) is what the
// database holds: after each step the two are compared, the database read by a reader
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
		node.Labels, node.Drivers, node.MACs = map[string]string{"rack": "r1"}, map[string]string{"power": "redfish"}, []string{"52:54:00:00:00:01"}
		if err := tx.InsertNode(ctx, &node); err != nil {
			return err
		}
		if err := tx.InsertNode(ctx, &other); err != nil {
			return err
		}
		wf = Workflow{NodeID: node.ID, TenantID: pool.TenantID, Profile: "p", Owner: "metal", Steps: "[]", Cleanup: "[]", State: "running",
			Phase: "steps", CommandKinds: []string{"power.on"}}
		return tx.InsertWorkflow(ctx, &wf)
	}); err != nil {
		t.Fatal(err)
	}
	// cached reads the node and its open workflow in a write, twice (the second from the cache).
	cached := func() (Node, Workflow, bool) {
		t.Helper()
		var n Node
		var w Workflow
		var open bool
		if err := s.Write(ctx, func(tx *Tx) error {
			for range 2 {
				var err error
				if n, err = tx.LockNode(ctx, node.ID, ""); err != nil {
					return err
				}
				if w, open, err = tx.OpenWorkflow(ctx, node.ID); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return n, w, open
	}
	stored := func() (Node, Workflow, bool) {
		t.Helper()
		n, err := s.Node(ctx, node.ID, "")
		if err != nil {
			t.Fatal(err)
		}
		w, open, err := scanOpenWorkflow(s.queryRow(ctx, openWorkflowQuery, node.ID, false), node.ID)
		if err != nil {
			t.Fatal(err)
		}
		return n, w, open
	}
	errUndone := errors.New("undone")
	steps := []struct {
		name  string
		write func(tx *Tx) error
		// fails: the write returns an error (its writes are undone).
		fails bool
	}{
		{"nothing changed", func(tx *Tx) error { return nil }, false},
		{"UpdateNode sets every mutable field", func(tx *Tx) error {
			n, err := tx.LockNode(ctx, node.ID, "")
			if err != nil {
				return err
			}
			n.State, n.BatchID, n.TargetState, n.ChainVerb, n.FailedFrom, n.FaultCode, n.FaultMsg = "failed", "b1", "ready", "provide", "inspecting", "F1", "broke"
			n.Maintenance, n.MaintenanceReason, n.Power, n.DeployProfile, n.DeployImage, n.WipeMode = true, "why", "on", "dp", "img", "quick"
			n.IdentityGeneration, n.VerbFrom, n.VerbBy, n.Conditions = 7, "api", "alice", map[string]string{"c": "v"}
			n.BMCUsernameRef, n.BMCPasswordRef, n.LingerUntil, n.LingerCommand, n.BootMode = "secret://u2", "secret://p2", 99, "cmd", "uefi"
			return tx.UpdateNode(ctx, &n)
		}, false},
		{"UpdateNode keeping state and batch", func(tx *Tx) error {
			n, err := tx.LockNode(ctx, node.ID, "")
			if err != nil {
				return err
			}
			n.Power, n.Conditions = "off", nil
			return tx.UpdateNode(ctx, &n)
		}, false},
		{"another statement sets a column UpdateNode does not", func(tx *Tx) error {
			_, err := tx.exec(ctx, `UPDATE nodes SET deploy_image_digest = ?, name = ? WHERE id = ?`, "sha256:x", "renamed", node.ID)
			return err
		}, false},
		{"a workflow's step moves on", func(tx *Tx) error {
			w, _, err := tx.OpenWorkflow(ctx, node.ID)
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
		{"UpdateNode, then the write fails", func(tx *Tx) error {
			n, err := tx.LockNode(ctx, node.ID, "")
			if err != nil {
				return err
			}
			n.Power = "cycling"
			if err := tx.UpdateNode(ctx, &n); err != nil {
				return err
			}
			if _, err := tx.LockNode(ctx, node.ID, ""); err != nil {
				return err
			}
			return errUndone
		}, true},
		{"a step, then the write fails", func(tx *Tx) error {
			w, _, err := tx.OpenWorkflow(ctx, node.ID)
			if err != nil {
				return err
			}
			w.StepIndex = 5
			if err := tx.UpdateWorkflow(ctx, &w); err != nil {
				return err
			}
			return errUndone
		}, true},
		{"the workflow ends, its outcome applied", func(tx *Tx) error {
			w, _, err := tx.OpenWorkflow(ctx, node.ID)
			if err != nil {
				return err
			}
			w.State, w.OutcomeApplied, w.FinishedAt = "succeeded", true, 5
			return tx.UpdateWorkflow(ctx, &w)
		}, false},
		{"a workflow opens for a node cached with none", func(tx *Tx) error {
			w := Workflow{NodeID: node.ID, TenantID: node.TenantID, Profile: "q", Owner: "metal", Steps: "[]", Cleanup: "[]", State: "running", Phase: "steps"}
			return tx.InsertWorkflow(ctx, &w)
		}, false},
		{"the new workflow ends", func(tx *Tx) error {
			w, _, err := tx.OpenWorkflow(ctx, node.ID)
			if err != nil {
				return err
			}
			w.State, w.OutcomeApplied, w.FinishedAt = "failed", true, 6
			return tx.UpdateWorkflow(ctx, &w)
		}, false},
		{"a closed workflow the cache does not know opens again", func(tx *Tx) error {
			clear(tx.rows().wfNodes)
			_, err := tx.exec(ctx, `UPDATE workflows SET outcome_applied = ?, finished_at = 0 WHERE id = ?`, false, wf.ID)
			return err
		}, false},
		{"a node's power recorded", func(tx *Tx) error { return tx.SetPower(ctx, node.ID, "on") }, false},
		{"a statement changes many nodes at once", func(tx *Tx) error {
			_, err := tx.exec(ctx, `UPDATE nodes SET maintenance_reason = 'all' WHERE tenant_id = ?`, node.TenantID)
			return err
		}, false},
		{"another connection changes the node", func(tx *Tx) error {
			// (after this write commits: see below)
			return nil
		}, false},
	}
	for _, st := range steps {
		cached() // (the rows as they were, in the cache)
		err := s.Write(ctx, st.write)
		if st.fails != (err != nil) {
			t.Fatalf("%s: write returned %v", st.name, err)
		}
		if st.name == "another connection changes the node" {
			if _, err := s.write.ExecContext(ctx, `UPDATE nodes SET power = 'elsewhere' WHERE id = ?`, node.ID); err != nil {
				t.Fatal(err)
			}
		}
		cn, cw, copen := cached()
		sn, sw, sopen := stored()
		if !reflect.DeepEqual(cn, sn) {
			t.Errorf("%s: the writer reads node\n%+v\nthe database holds\n%+v", st.name, cn, sn)
		}
		if copen != sopen || !reflect.DeepEqual(cw, sw) {
			t.Errorf("%s: the writer reads open workflow (%v)\n%+v\nthe database holds (%v)\n%+v", st.name, copen, cw, sopen, sw)
		}
	}
	if w := s.WriterStats(); w.CacheHits == 0 || w.CacheHits >= w.CachedReads {
		t.Errorf("cache: %d hits of %d reads: want some, not all", w.CacheHits, w.CachedReads)
	}
	// A copy: changing what a read returned changes nothing cached.
	if err := s.Write(ctx, func(tx *Tx) error {
		n, err := tx.LockNode(ctx, node.ID, "")
		if err != nil {
			return err
		}
		n.Labels["rack"], n.MACs[0] = "changed", "changed"
		w, _, err := tx.OpenWorkflow(ctx, node.ID)
		if err != nil {
			return err
		}
		w.CommandKinds = append(w.CommandKinds[:0], "changed")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cn, _, _ := cached()
	if cn.Labels["rack"] != "r1" || cn.MACs[0] != "52:54:00:00:00:01" {
		t.Errorf("a caller's change to a node it read reached the cache: %v %v", cn.Labels, cn.MACs)
	}
	// A workflow's node never changes.
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.exec(ctx, `UPDATE workflows SET node_id = ? WHERE node_id = ?`, other.ID, node.ID)
		return err
	}); err == nil || !strings.Contains(err.Error(), "never changes") {
		t.Errorf("a workflow moved to another node: %v, want refused", err)
	}
	// A deleted node is gone.
	if err := s.Write(ctx, func(tx *Tx) error {
		n, err := tx.LockNode(ctx, other.ID, "")
		if err != nil {
			return err
		}
		return tx.DeleteNode(ctx, n)
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.LockNode(ctx, other.ID, "")
		return err
	}); !errors.Is(err, ErrNotFound) {
		t.Errorf("a deleted node read by the writer: %v, want not found", err)
	}
}
