package store_test

import (
	"context"
	"errors"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// keepCommands makes three commands ones history retention keeps: proof a signed result,
// lingering the node's lingering ramdisk's power-off, token a join token's.
func keepCommands(ctx context.Context, tx *store.Tx, n store.Node, proof, lingering, token string) error {
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`UPDATE commands SET attested = ?, result_sig = ? WHERE id = ?`, []any{true, []byte("sig"), proof}},
		{`UPDATE nodes SET linger_command = ? WHERE id = ?`, []any{lingering, n.ID}},
		{`INSERT INTO join_tokens (hash, kind, site_id, node_id, generation, expires_at, created_at, command_id) VALUES (?, 'node', ?, ?, 1, 1, 1, ?)`,
			[]any{"h1", n.SiteID, n.ID, token}},
	} {
		if _, err := tx.ExecForTests(ctx, q.sql, q.args...); err != nil {
			return err
		}
	}
	return nil
}

// History retention deletes the ended workflows and their finished commands from before the
// retention, and old events, a bounded batch at a time; it keeps wipe proofs, commands rows in
// use still name, workflows with a command not finished, workflows not ended or ended since,
// and events since.
func TestPurgeHistory(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		n := nodes[0]
		const old, cutoff, recent = 100, 1000, 5000
		wf := map[string]string{}  // name → workflow id
		cmd := map[string]string{} // name → command id
		batches := map[string]string{}
		err := st.Write(ctx, func(tx *store.Tx) error {
			for _, w := range []struct {
				name     string
				finished int64
				applied  bool
			}{{"old", old, true}, {"old-unfinished-command", old, true}, {"recent", recent, true}, {"open", 0, false}, {"old-not-applied", old, false}} {
				row := store.Workflow{NodeID: n.ID, TenantID: n.TenantID, Profile: "metal-inspect", Owner: "metal", NodeState: "inspecting",
					Steps: "[]", Cleanup: "[]", State: "succeeded", Phase: "done", FinishedAt: w.finished, OutcomeApplied: w.applied}
				if err := tx.InsertWorkflow(ctx, &row); err != nil {
					return err
				}
				wf[w.name] = row.ID
			}
			for _, c := range []struct{ name, workflow, state string }{
				{"done", "old", "succeeded"}, {"failed", "old", "failed"}, {"lost", "old", "lost"},
				{"proof", "old", "succeeded"}, {"lingering", "old", "succeeded"}, {"token", "old", "succeeded"},
				{"running", "old-unfinished-command", "running"}, {"beside-running", "old-unfinished-command", "succeeded"},
				{"recent", "recent", "succeeded"}, {"open", "open", "succeeded"}, {"not-applied", "old-not-applied", "succeeded"},
			} {
				row := store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: "bmc.query", Args: "{}", RunsOn: "site",
					WorkflowID: wf[c.workflow], State: c.state}
				if err := tx.InsertCommand(ctx, &row); err != nil {
					return err
				}
				cmd[c.name] = row.ID
			}
			if err := keepCommands(ctx, tx, n, cmd["proof"], cmd["lingering"], cmd["token"]); err != nil {
				return err
			}
			for _, b := range []struct {
				name, state string
				created     int64
			}{{"ended", "running", old}, {"rejected", "rejected", old}, {"proof's", "running", old}, {"recent", "running", recent}, {"pending", "pending", old}} {
				row := store.Batch{TenantID: n.TenantID, SiteID: n.SiteID, Kind: "node", Verb: "metal-inspect", RequestedBy: "test", Size: 1}
				if err := tx.InsertBatch(ctx, &row, []store.Leaf{{Subject: n.ID, Kind: "node"}}); err != nil {
					return err
				}
				if _, err := tx.ExecForTests(ctx, `UPDATE batches SET state = ?, created_at = ? WHERE id = ?`, b.state, b.created, row.ID); err != nil {
					return err
				}
				if _, err := tx.ExecForTests(ctx, `INSERT INTO approvals (batch_id, approver, at) VALUES (?, 'alice', 1)`, row.ID); err != nil {
					return err
				}
				batches[b.name] = row.ID
			}
			if _, err := tx.ExecForTests(ctx, `UPDATE commands SET batch_id = ? WHERE id = ?`, batches["proof's"], cmd["proof"]); err != nil {
				return err
			}
			var evs []store.Event
			for _, at := range []int64{old, old + 1, old + 2, recent, recent + 1} {
				evs = append(evs, store.Event{At: at, TenantID: n.TenantID, NodeID: n.ID, Actor: "test", Kind: "test.event", Data: "{}"})
			}
			if err := tx.AppendEvents(ctx, evs); err != nil {
				return err
			}
			// AppendEvents stamps the transaction's time (now, after every time above): give
			// the test's events theirs, oldest first by id, and the seed's a recent one.
			for _, at := range []int64{old, old + 1, old + 2, recent, recent + 1} {
				if _, err := tx.ExecForTests(ctx, `UPDATE events SET at = ? WHERE id = (SELECT MIN(id) FROM events WHERE kind = 'test.event' AND at > ?)`,
					at, recent+1); err != nil {
					return err
				}
			}
			_, err := tx.ExecForTests(ctx, `UPDATE events SET at = ? WHERE kind <> 'test.event'`, recent)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}

		purge := func() store.Purged {
			t.Helper()
			var p store.Purged
			if err := st.Write(ctx, func(tx *store.Tx) error {
				var err error
				p, err = tx.PurgeHistory(ctx, cutoff, 10, cutoff, 2)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return p
		}
		steps := []store.Purged{
			// "old": done, failed, lost; two events of three (the limit); "ended" and "rejected"
			{Workflows: 1, Commands: 3, Events: 2, Batches: 2},
			{Events: 1},
			{},
		}
		for i, want := range steps {
			if got := purge(); got != want {
				t.Fatalf("pass %d: purged %+v, want %+v", i+1, got, want)
			}
		}
		gone := map[string]bool{"done": true, "failed": true, "lost": true}
		for name, id := range cmd {
			err := st.Write(ctx, func(tx *store.Tx) error { _, err := tx.Command(ctx, id); return err })
			switch {
			case gone[name] && !errors.Is(err, store.ErrNotFound):
				t.Errorf("command %q: %v, want it deleted", name, err)
			case !gone[name] && err != nil:
				t.Errorf("command %q: %v, want it kept", name, err)
			}
		}
		for name, id := range wf {
			var count int64
			if err := st.Write(ctx, func(tx *store.Tx) error {
				var err error
				count, err = tx.QueryIntForTests(ctx, `SELECT COUNT(*) FROM workflows WHERE id = ?`, id)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int64{true: 0, false: 1}[name == "old"]; count != want {
				t.Errorf("workflow %q: %d rows, want %d", name, count, want)
			}
		}
		for name, id := range batches {
			var count int64
			if err := st.Write(ctx, func(tx *store.Tx) error {
				var err error
				count, err = tx.QueryIntForTests(ctx, `SELECT (SELECT COUNT(*) FROM batches WHERE id = ?) + (SELECT COUNT(*) FROM batch_leaves WHERE batch_id = ?)
					+ (SELECT COUNT(*) FROM approvals WHERE batch_id = ?)`, id, id, id)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int64{true: 0, false: 3}[name == "ended" || name == "rejected"]; count != want {
				t.Errorf("batch %q: %d rows with its leaves and approvals, want %d", name, count, want)
			}
		}
		var left int64
		if err := st.Write(ctx, func(tx *store.Tx) error {
			var err error
			left, err = tx.QueryIntForTests(ctx, `SELECT COUNT(*) FROM events WHERE at < ?`, cutoff)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if left != 0 {
			t.Errorf("%d events before the retention left", left)
		}
	})
}

// Commands of no workflow are history too: those run without one go once they finished before
// the retention, and those an ended workflow left because a row named them go once nothing
// does; a proof stays, with its workflow's id.
func TestPurgeLooseCommands(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		n := nodes[0]
		const old, cutoff, recent = 100, 1000, 5000
		cmd := map[string]string{}
		var wfID string
		err := st.Write(ctx, func(tx *store.Tx) error {
			w := store.Workflow{NodeID: n.ID, TenantID: n.TenantID, Profile: "metal-release", Owner: "metal", NodeState: "releasing",
				Steps: "[]", Cleanup: "[]", State: "succeeded", Phase: "done", FinishedAt: old, OutcomeApplied: true}
			if err := tx.InsertWorkflow(ctx, &w); err != nil {
				return err
			}
			wfID = w.ID
			for _, c := range []struct {
				name, workflow, state string
				finished              int64
			}{
				{"old", "", "succeeded", old}, {"old-failed", "", "failed", old}, {"recent", "", "succeeded", recent},
				{"running", "", "running", 0}, {"named", "", "succeeded", old},
				{"workflow's-named", w.ID, "succeeded", old}, {"workflow's-proof", w.ID, "succeeded", old}, {"workflow's", w.ID, "succeeded", old},
			} {
				row := store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: "bmc.power", Args: "{}", RunsOn: "site",
					WorkflowID: c.workflow, State: c.state, FinishedAt: c.finished}
				if err := tx.InsertCommand(ctx, &row); err != nil {
					return err
				}
				cmd[c.name] = row.ID
			}
			return keepCommands(ctx, tx, n, cmd["workflow's-proof"], cmd["workflow's-named"], cmd["named"])
		})
		if err != nil {
			t.Fatal(err)
		}
		purge := func(limit int) store.Purged {
			t.Helper()
			var p store.Purged
			if err := st.Write(ctx, func(tx *store.Tx) error {
				var err error
				p, err = tx.PurgeHistory(ctx, cutoff, limit, 0, 0)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return p
		}
		exists := func(name string) bool {
			t.Helper()
			err := st.Write(ctx, func(tx *store.Tx) error { _, err := tx.Command(ctx, cmd[name]); return err })
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				t.Fatal(err)
			}
			return err == nil
		}
		// The workflow and its plain command go; "old" and "old-failed" are the loose pass's.
		if got, want := purge(1), (store.Purged{Workflows: 1, Commands: 3, Loose: 2}); got != want {
			t.Fatalf("first pass: %+v, want %+v", got, want)
		}
		for name, want := range map[string]bool{"old": false, "old-failed": false, "recent": true, "running": true, "named": true,
			"workflow's-named": true, "workflow's-proof": true, "workflow's": false} {
			if got := exists(name); got != want {
				t.Errorf("after the first pass command %q exists: %t, want %t", name, got, want)
			}
		}
		var proofsWorkflow string
		if err := st.Write(ctx, func(tx *store.Tx) error {
			c, err := tx.Command(ctx, cmd["workflow's-proof"])
			proofsWorkflow = c.WorkflowID
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if proofsWorkflow != wfID {
			t.Errorf("the proof's workflow id is %q, want %q kept", proofsWorkflow, wfID)
		}
		if got := purge(1); got != (store.Purged{}) {
			t.Fatalf("second pass with the names in place: %+v, want nothing", got)
		}
		// Once nothing names them, the kept commands go: the one run without a workflow, and
		// the one its ended workflow left behind.
		if err := st.Write(ctx, func(tx *store.Tx) error {
			for _, q := range []string{`UPDATE nodes SET linger_command = '' WHERE id = ?`, `DELETE FROM join_tokens WHERE node_id = ?`} {
				if _, err := tx.ExecForTests(ctx, q, n.ID); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if got, want := purge(1), (store.Purged{Commands: 2, Loose: 2}); got != want {
			t.Fatalf("pass once nothing names them: %+v, want %+v", got, want)
		}
		for name, want := range map[string]bool{"named": false, "workflow's-named": false, "workflow's-proof": true, "recent": true, "running": true} {
			if got := exists(name); got != want {
				t.Errorf("at the end command %q exists: %t, want %t", name, got, want)
			}
		}
	})
}
