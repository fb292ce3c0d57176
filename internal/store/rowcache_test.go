package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		q    string
		want touch
	}{
		{updateNodeStmt, 0},
		{setPowerStmt, 0},
		{pinDeployImageStmt, 0},
		{insertWorkflowStmt, 0},
		{updateWorkflowStmt, 0},
		{"SELECT " + nodeCols + " FROM nodes WHERE id = ?", 0},
		{"\n\t\tselect 1 from workflows", 0},
		{"BEGIN IMMEDIATE", 0},
		{"COMMIT", 0},
		{"SAVEPOINT w", 0},
		{"RELEASE SAVEPOINT w", 0},
		{"ROLLBACK", touchAll},
		{"ROLLBACK TO SAVEPOINT w", touchAll},
		{"UPDATE nodes SET labels = ? WHERE id = ?", touchNodes},
		{"  update NODES set power = ?, version = version + 1 WHERE id = ?", touchNodes},
		{"DELETE FROM nodes WHERE id = ? AND version = ?", touchNodes},
		{"INSERT INTO nodes (id) VALUES (?)", touchNodes},
		{"UPDATE workflows SET abort_requested = ? WHERE node_id = ?", touchWorkflows},
		{"DELETE FROM workflows WHERE id IN (?)", touchWorkflows},
		{"WITH w AS (SELECT id FROM workflows) UPDATE nodes SET state = 'x' WHERE id IN (SELECT node_id FROM w)", touchAll},
		{"UPDATE commands SET state = 'failed' WHERE node_id = ?", 0},
		{"INSERT INTO events (at, node_id) VALUES (?, ?)", 0},
	} {
		if got := classify(c.q); got != c.want {
			t.Errorf("classify(%.50q) = %b, want %b", c.q, got, c.want)
		}
	}
}

// The writer's row cache answers LockNode and OpenWorkflow exactly as the database would,
// whatever the writes in between: those whose effect it applies, others that name the tables,
// writes that fail and are undone, savepoints rolled back, and callers that change what they
// read without writing it.
func TestWriterRowCacheMatchesTheDatabase(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, "sqlite://"+filepath.Join(t.TempDir(), "bcd.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var ids []string
	err = s.Write(ctx, func(tx *Tx) error {
		if err := tx.PutHardwareProfile(ctx, HardwareProfile{Name: "redfish", Drivers: map[string]string{"power": "redfish"}, LocalBoot: "exit"}); err != nil {
			return err
		}
		tn, err := tx.InsertTenant(ctx, "t")
		if err != nil {
			return err
		}
		site, err := tx.InsertSite(ctx, tn.ID, "s", nil)
		if err != nil {
			return err
		}
		pool, err := tx.InsertPool(ctx, Pool{TenantID: tn.ID, SiteID: site.ID, Name: "p", Policy: PoolPolicy{HardwareProfile: "redfish"}})
		if err != nil {
			return err
		}
		for i := range 3 {
			n := Node{ID: NewID(time.Now()), TenantID: tn.ID, SiteID: site.ID, PoolID: pool.ID, Name: fmt.Sprintf("n%d", i),
				State: "enrolling", TargetState: "ready", HardwareProfile: "redfish", BMCDriver: "redfish", BMCAddress: "https://x",
				BMCUsernameRef: "secret://u", BMCPasswordRef: "secret://p", MACs: []string{fmt.Sprintf("52:54:00:00:00:%02x", i)},
				Labels: map[string]string{"rack": "r1"}}
			if err := tx.InsertNode(ctx, &n); err != nil {
				return err
			}
			ids = append(ids, n.ID)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	refused := errors.New("refused")
	rng := rand.New(rand.NewPCG(1, 2))
	type op struct {
		name string
		f    func(tx *Tx, id string) error
	}
	lockedUpdate := func(tx *Tx, id string, change func(*Node)) error {
		n, err := tx.LockNode(ctx, id, "")
		if err != nil {
			return err
		}
		change(&n)
		return tx.UpdateNode(ctx, &n)
	}
	ops := []op{
		{"UpdateNode", func(tx *Tx, id string) error {
			return lockedUpdate(tx, id, func(n *Node) {
				n.State = fmt.Sprint("s", rng.IntN(100))
				n.Conditions = map[string]string{"c": fmt.Sprint(rng.IntN(9))}
				n.Labels["written"] = "never" // not a column UpdateNode writes
				n.Maintenance = rng.IntN(2) == 0
			})
		}},
		{"UpdateNode with no conditions", func(tx *Tx, id string) error {
			return lockedUpdate(tx, id, func(n *Node) { n.Conditions = nil })
		}},
		{"SetPower", func(tx *Tx, id string) error { return tx.SetPower(ctx, id, []string{"on", "off"}[rng.IntN(2)]) }},
		{"PinDeployImage", func(tx *Tx, id string) error { return tx.PinDeployImage(ctx, id, "sha256:1") }},
		{"InsertWorkflow", func(tx *Tx, id string) error {
			return tx.InsertWorkflow(ctx, &Workflow{NodeID: id, TenantID: "t", Profile: "p", Owner: "metal", Steps: "[]", Cleanup: "[]",
				CommandKinds: []string{"bmc.power"}, State: "running", Phase: "steps"})
		}},
		{"UpdateWorkflow", func(tx *Tx, id string) error {
			w, open, err := tx.OpenWorkflow(ctx, id)
			if err != nil || !open {
				return err
			}
			w.StepIndex++
			w.CommandKinds[0] = "changed, not written"
			w.OutcomeApplied = rng.IntN(4) == 0
			return tx.UpdateWorkflow(ctx, &w)
		}},
		{"another statement on nodes", func(tx *Tx, id string) error {
			_, err := tx.exec(ctx, `UPDATE nodes SET labels = ?, bmc_address = ? WHERE id = ?`, fmt.Sprintf(`{"r":"%d"}`, rng.IntN(9)), "https://y", id)
			return err
		}},
		{"another statement on workflows", func(tx *Tx, id string) error {
			_, err := tx.exec(ctx, `UPDATE workflows SET abort_requested = ?, outcome_applied = ? WHERE node_id = ?`, true, rng.IntN(3) == 0, id)
			return err
		}},
		{"a write that fails after its writes", func(tx *Tx, id string) error {
			if err := lockedUpdate(tx, id, func(n *Node) { n.State = "undone" }); err != nil {
				return err
			}
			if err := tx.SetPower(ctx, id, "undone"); err != nil {
				return err
			}
			return refused
		}},
		{"a savepoint rolled back", func(tx *Tx, id string) error {
			err := tx.Savepoint(ctx, func() error {
				if err := lockedUpdate(tx, id, func(n *Node) { n.State = "undone" }); err != nil {
					return err
				}
				w, open, err := tx.OpenWorkflow(ctx, id)
				if err == nil && open {
					w.StepIndex = 99
					err = tx.UpdateWorkflow(ctx, &w)
				}
				return errors.Join(err, refused)
			})
			if !errors.Is(err, refused) {
				return fmt.Errorf("savepoint: %v", err)
			}
			return tx.SetPower(ctx, id, "after")
		}},
		{"a reader changes what it read", func(tx *Tx, id string) error {
			n, err := tx.LockNode(ctx, id, "")
			if err != nil {
				return err
			}
			n.Conditions["mutated"] = "in memory"
			n.Labels["mutated"] = "in memory"
			n.MACs[0] = "mutated"
			return nil
		}},
	}
	for i := range 400 {
		o, id := ops[rng.IntN(len(ops))], ids[rng.IntN(len(ids))]
		err := s.Write(ctx, func(tx *Tx) error { return o.f(tx, id) })
		if err != nil && !errors.Is(err, refused) {
			t.Fatalf("op %d %s: %v", i, o.name, err)
		}
		var cached Node
		var wf Workflow
		var open bool
		if err := s.Write(ctx, func(tx *Tx) error {
			var err error
			if cached, err = tx.LockNode(ctx, id, ""); err != nil {
				return err
			}
			wf, open, err = tx.OpenWorkflow(ctx, id)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		stored, err := s.Node(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(cached, stored) {
			t.Fatalf("after op %d (%s) the writer read node\n%+v\nthe database holds\n%+v", i, o.name, cached, stored)
		}
		storedWF, storedOpen, err := scanOpenWorkflow(s.queryRow(ctx, openWorkflowQuery, id, false), id)
		if err != nil {
			t.Fatal(err)
		}
		if open != storedOpen || !reflect.DeepEqual(wf, storedWF) {
			t.Fatalf("after op %d (%s) the writer read the open workflow (%v)\n%+v\nthe database holds (%v)\n%+v", i, o.name, open, wf, storedOpen, storedWF)
		}
	}
	// (The cache answered: the last reads left both rows in it.)
	if len(s.lite.rows.nodes) == 0 || len(s.lite.rows.open) == 0 {
		t.Fatalf("the cache holds %d nodes and %d workflows after the reads", len(s.lite.rows.nodes), len(s.lite.rows.open))
	}
}
