package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// On SQLite's writer, UpdateWorkflow of a running workflow and UpdateNode that keeps the node's
// state and batch leave the indexed columns out of the statement (SQLite rewrites an index's
// entries whenever an UPDATE sets one of its columns); what is stored is what the whole
// statement stores, whatever the row held.
func TestUpdatesLeaveUnchangedIndexedColumnsOut(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	var node Node
	var wf Workflow
	err := s.Write(ctx, func(tx *Tx) error {
		pool, err := seedPool(ctx, tx)
		if err != nil {
			return err
		}
		node = redfishNode(pool, "n", "enrolling")
		if err := tx.InsertNode(ctx, &node); err != nil {
			return err
		}
		wf = Workflow{NodeID: node.ID, TenantID: pool.TenantID, Profile: "p", Owner: "metal", Steps: "[]", Cleanup: "[]", State: "running", Phase: "steps"}
		return tx.InsertWorkflow(ctx, &wf)
	})
	if err != nil {
		t.Fatal(err)
	}
	// short says whether the writer prepared a statement that begins with prefix and holds part.
	short := func(prefix, part string) bool {
		for q := range s.lite.stmts {
			if strings.HasPrefix(q, prefix) && strings.Contains(q, part) {
				return true
			}
		}
		return false
	}
	stored := func() (Node, Workflow) {
		n, err := s.Node(ctx, node.ID, "")
		if err != nil {
			t.Fatal(err)
		}
		w, ok, err := scanOpenWorkflow(s.queryRow(ctx, selectWorkflows+fromWorkflows+` WHERE w.id = ? AND ? = ?`, wf.ID, false, false), node.ID)
		if err != nil || !ok {
			t.Fatalf("workflow: %v %v", ok, err)
		}
		return n, w
	}

	// A step moves on: the short statement.
	if err := s.Write(ctx, func(tx *Tx) error {
		w := wf
		w.StepIndex, w.CurrentCommand = 3, "c1"
		return tx.UpdateWorkflow(ctx, &w)
	}); err != nil {
		t.Fatal(err)
	}
	if _, w := stored(); w.StepIndex != 3 || w.CurrentCommand != "c1" || w.OutcomeApplied {
		t.Fatalf("workflow after a step: %+v", w)
	}
	if !short("UPDATE workflows SET", "id = ? AND NOT outcome_applied AND finished_at = 0") {
		t.Error("the running workflow's update was not the statement without outcome_applied and finished_at")
	}
	// Stored as ended meanwhile (another statement): the caller's open, unfinished row is
	// written whole, as before.
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.exec(ctx, `UPDATE workflows SET outcome_applied = ?, finished_at = ? WHERE id = ?`, true, 77, wf.ID)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, func(tx *Tx) error {
		w := wf
		w.StepIndex = 4
		return tx.UpdateWorkflow(ctx, &w)
	}); err != nil {
		t.Fatal(err)
	}
	if _, w := stored(); w.StepIndex != 4 || w.OutcomeApplied || w.FinishedAt != 0 {
		t.Fatalf("workflow written over an ended row: step %d, applied %v, finished %d; want 4, false, 0", w.StepIndex, w.OutcomeApplied, w.FinishedAt)
	}
	// Its end: the whole statement.
	if err := s.Write(ctx, func(tx *Tx) error {
		w := wf
		w.State, w.OutcomeApplied, w.FinishedAt = "succeeded", true, 99
		return tx.UpdateWorkflow(ctx, &w)
	}); err != nil {
		t.Fatal(err)
	}
	if _, w := stored(); w.State != "succeeded" || !w.OutcomeApplied || w.FinishedAt != 99 {
		t.Fatalf("ended workflow: %+v", w)
	}

	// A node read and written with its state and batch kept: the short statement, twice in one
	// transaction (the first write's version is the second's).
	if err := s.Write(ctx, func(tx *Tx) error {
		n, err := tx.LockNode(ctx, node.ID, "")
		if err != nil {
			return err
		}
		n.Power, n.DeployImage = "on", "img"
		if err := tx.UpdateNode(ctx, &n); err != nil {
			return err
		}
		n.FaultCode = "F"
		return tx.UpdateNode(ctx, &n)
	}); err != nil {
		t.Fatal(err)
	}
	if n, _ := stored(); n.Power != "on" || n.DeployImage != "img" || n.FaultCode != "F" || n.State != "enrolling" || n.Version != 3 {
		t.Fatalf("node: power %s image %s fault %s state %s version %d", n.Power, n.DeployImage, n.FaultCode, n.State, n.Version)
	}
	if !short("UPDATE nodes SET target_state = ?", "") {
		t.Error("the node's update with its state and batch kept set them anyway")
	}
	// State and batch changed: written.
	if err := s.Write(ctx, func(tx *Tx) error {
		n, err := tx.LockNode(ctx, node.ID, "")
		if err != nil {
			return err
		}
		n.State, n.BatchID = "ready", "b1"
		if err := tx.UpdateNode(ctx, &n); err != nil {
			return err
		}
		n.Maintenance = true // (short again: state and batch as just written)
		return tx.UpdateNode(ctx, &n)
	}); err != nil {
		t.Fatal(err)
	}
	if n, _ := stored(); n.State != "ready" || n.BatchID != "b1" || !n.Maintenance || n.Version != 5 {
		t.Fatalf("node: state %s batch %s maintenance %v version %d", n.State, n.BatchID, n.Maintenance, n.Version)
	}
	// A stale version is refused by the short statement too.
	if err := s.Write(ctx, func(tx *Tx) error {
		n, err := tx.LockNode(ctx, node.ID, "")
		if err != nil {
			return err
		}
		if _, err := tx.exec(ctx, `UPDATE nodes SET version = version + 1 WHERE id = ?`, n.ID); err != nil {
			return err
		}
		return tx.UpdateNode(ctx, &n)
	}); !errors.Is(err, ErrStale) {
		t.Fatalf("update at a stale version: %v, want ErrStale", err)
	}
	// Written in a savepoint rolled back: the next update, from a fresh read, is stored whole.
	if err := s.Write(ctx, func(tx *Tx) error {
		n, err := tx.LockNode(ctx, node.ID, "")
		if err != nil {
			return err
		}
		undone := errors.New("undone")
		if err := tx.Savepoint(ctx, func() error {
			m := n
			m.State = "gone"
			return errors.Join(tx.UpdateNode(ctx, &m), undone)
		}); !errors.Is(err, undone) {
			return err
		}
		n.TargetState = "deployed"
		return tx.UpdateNode(ctx, &n)
	}); err != nil {
		t.Fatal(err)
	}
	if n, _ := stored(); n.State != "ready" || n.TargetState != "deployed" {
		t.Fatalf("node after a savepoint rolled back: state %s target %s", n.State, n.TargetState)
	}
	// The state changed alone, then the batch alone: each statement sets its own column only.
	for _, c := range []struct{ state, batch, sets string }{
		{"deploying", "b1", ", state = ? WHERE"},
		{"deploying", "b2", ", batch_id = ? WHERE"},
	} {
		if err := s.Write(ctx, func(tx *Tx) error {
			n, err := tx.LockNode(ctx, node.ID, "")
			if err != nil {
				return err
			}
			n.State, n.BatchID = c.state, c.batch
			return tx.UpdateNode(ctx, &n)
		}); err != nil {
			t.Fatal(err)
		}
		if n, _ := stored(); n.State != c.state || n.BatchID != c.batch {
			t.Fatalf("node: state %s batch %s, want %s %s", n.State, n.BatchID, c.state, c.batch)
		}
		if !short("UPDATE nodes SET target_state = ?", c.sets) {
			t.Errorf("no update of the node ending %q was prepared", c.sets)
		}
	}
}

// UpdateNode leaves a node's state and batch out of its statement when the version it read
// them at is still the row's: every statement that sets either must bump the version.
func TestNodeStateAndBatchChangeWithTheVersion(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	setsKey := regexp.MustCompile(`(?s)UPDATE nodes SET(.*?)WHERE`)
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range setsKey.FindAllStringSubmatch(string(src), -1) {
			set := m[1]
			if strings.Contains(set, "`+") || strings.Contains(set, "` +") {
				// A SET put together in Go: UpdateNode's alone, whose parts are constants.
				if f != "nodes.go" || !strings.HasPrefix(strings.TrimSpace(set), "` + nodeUpdateSet + `") {
					t.Errorf("%s: UPDATE nodes SET %.80q… is put together in Go: this test cannot read it", f, strings.TrimSpace(set))
				}
				set = nodeUpdateSet + strings.TrimPrefix(strings.TrimSpace(set), "` + nodeUpdateSet + `")
			}
			if !regexp.MustCompile(`(^|[\s,])(state|batch_id)\s*=`).MatchString(set) {
				continue
			}
			checked++
			if !strings.Contains(set, "version = version + 1") {
				t.Errorf("%s: UPDATE nodes SET %.80q… sets the state or batch without bumping the version", f, strings.Join(strings.Fields(set), " "))
			}
		}
	}
	if checked < 3 { // UpdateNode, MoveNodes, SetNodeFault
		t.Fatalf("found %d statements that set a node's state or batch, want at least 3", checked)
	}
}
