package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// rowSet is a node, its open workflow and a command of it.
type rowSet struct {
	node Node
	wf   Workflow
	cmd  Command
}

// The writer updates a node, its open workflow and its commands through the rowid its cache
// holds (updateByRow). Each update is run with the cache's rowid as it is, and with the rowid of
// the other node's row put in the cache in its place (a wrong rowid, which the cache's invariant
// rules out): the update lands on its own row either way, and never on the other's.
func TestWriterUpdatesCachedRowsByTheirRowid(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// byRow begins the statement by rowid that must have run.
		byRow string
		// update changes r's rows in tx; mangle puts the other's rowid in the cache for r.
		update func(tx *Tx, r *rowSet) error
		mangle func(tx *Tx, r, other *rowSet) error
		// stored reads what the update changes of r's rows, as stored; want is it updated.
		stored func(tx *Tx, r rowSet) (string, error)
		want   string
	}{
		{
			name:  "node",
			byRow: "UPDATE nodes SET target_state = ?",
			update: func(tx *Tx, r *rowSet) error {
				n, err := tx.LockNode(ctx, r.node.ID, "")
				if err != nil {
					return err
				}
				n.FaultMsg, n.State = "updated", "inspecting"
				return tx.UpdateNode(ctx, &n)
			},
			mangle: mangleNode,
			stored: func(tx *Tx, r rowSet) (string, error) {
				return storedCols(tx, `SELECT state || ' ' || fault_message || ' ' || version FROM nodes WHERE id = ?`, r.node.ID)
			},
			want: "inspecting updated 2",
		},
		{
			name:  "power",
			byRow: "UPDATE nodes SET power = ?",
			update: func(tx *Tx, r *rowSet) error {
				return tx.SetPower(ctx, r.node.ID, "on")
			},
			mangle: mangleNode,
			stored: func(tx *Tx, r rowSet) (string, error) {
				return storedCols(tx, `SELECT power FROM nodes WHERE id = ?`, r.node.ID)
			},
			want: "on",
		},
		{
			name:  "report",
			byRow: "UPDATE commands SET state = ?",
			update: func(tx *Tx, r *rowSet) error {
				c := r.cmd
				c.State, c.Result = "running", `{"at":1}`
				return tx.ReportCommand(ctx, &c)
			},
			mangle: func(tx *Tx, r, other *rowSet) error {
				rc := tx.rows()
				rc.apply()
				e, ok := rc.cmds.get(r.cmd.ID)
				if !ok {
					return errors.New("the command is not cached")
				}
				var err error
				e.row, err = rowidOf(tx, "commands", other.cmd.ID)
				return err
			},
			stored: func(tx *Tx, r rowSet) (string, error) {
				return storedCols(tx, `SELECT state || ' ' || result FROM commands WHERE id = ?`, r.cmd.ID)
			},
			want: `running {"at":1}`,
		},
		{
			name:  "workflow step",
			byRow: "UPDATE workflows SET state = ?",
			update: func(tx *Tx, r *rowSet) error {
				w := r.wf
				w.StepIndex, w.CurrentCommand = 4, "c4"
				return tx.UpdateWorkflow(ctx, &w)
			},
			mangle: mangleWorkflow,
			stored: func(tx *Tx, r rowSet) (string, error) {
				return storedCols(tx, `SELECT step_index || ' ' || current_command FROM workflows WHERE id = ?`, r.wf.ID)
			},
			want: "4 c4",
		},
		{
			name:  "workflow end",
			byRow: "UPDATE workflows SET state = ?",
			update: func(tx *Tx, r *rowSet) error {
				w := r.wf
				w.State, w.OutcomeApplied, w.FinishedAt = "succeeded", true, 77
				return tx.UpdateWorkflow(ctx, &w)
			},
			mangle: mangleWorkflow,
			stored: func(tx *Tx, r rowSet) (string, error) {
				return storedCols(tx, `SELECT state || ' ' || outcome_applied || ' ' || finished_at FROM workflows WHERE id = ?`, r.wf.ID)
			},
			want: "succeeded 1 77",
		},
	}
	for _, c := range cases {
		for _, wrong := range []bool{false, true} {
			name := c.name
			if wrong {
				name += " with a wrong rowid"
			}
			t.Run(name, func(t *testing.T) {
				s := openTempSQLite(t)
				var rows [2]rowSet
				if err := s.Write(ctx, func(tx *Tx) error {
					pool, err := seedPool(ctx, tx)
					if err != nil {
						return err
					}
					for i := range rows {
						r := &rows[i]
						r.node = redfishNode(pool, []string{"a", "b"}[i], "enrolling")
						if err := tx.InsertNode(ctx, &r.node); err != nil {
							return err
						}
						r.wf = Workflow{NodeID: r.node.ID, TenantID: pool.TenantID, Profile: "p", Owner: "metal", Steps: "[]", Cleanup: "[]", State: "running", Phase: "steps"}
						if err := tx.InsertWorkflow(ctx, &r.wf); err != nil {
							return err
						}
						r.cmd = Command{NodeID: r.node.ID, TenantID: pool.TenantID, SiteID: pool.SiteID, Kind: "bmc.power", Subject: r.node.ID, RunsOn: "site", WorkflowID: r.wf.ID}
						if err := tx.InsertCommand(ctx, &r.cmd); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				var got [2]string
				var other string
				if err := s.Write(ctx, func(tx *Tx) error {
					var err error
					if other, err = c.stored(tx, rows[1]); err != nil {
						return err
					}
					// Read into the writer's caches (emptied, say, by another connection's commit).
					for _, r := range rows {
						if _, err := tx.LockNode(ctx, r.node.ID, ""); err != nil {
							return err
						}
						if _, _, err := tx.OpenWorkflow(ctx, r.node.ID); err != nil {
							return err
						}
						if _, err := tx.Command(ctx, r.cmd.ID); err != nil {
							return err
						}
					}
					if wrong {
						if err := c.mangle(tx, &rows[0], &rows[1]); err != nil {
							return err
						}
					}
					if err := c.update(tx, &rows[0]); err != nil {
						return err
					}
					for i := range got {
						if got[i], err = c.stored(tx, rows[i]); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if got[0] != c.want {
					t.Errorf("the updated row holds %q, want %q", got[0], c.want)
				}
				if got[1] != other {
					t.Errorf("the other row holds %q, was %q", got[1], other)
				}
				byRow := false
				for q := range s.lite.stmts {
					byRow = byRow || strings.HasPrefix(q, c.byRow) && strings.Contains(q, "WHERE rowid = ? AND id = ?")
				}
				if !byRow {
					t.Errorf("no statement %q… by rowid was prepared", c.byRow)
				}
			})
		}
	}
}

// A node's update by rowid at a version the row no longer holds is stale, as by id.
func TestWriterUpdateByRowidOfAStaleNode(t *testing.T) {
	ctx := context.Background()
	s, node := openWithNode(t)
	err := s.Write(ctx, func(tx *Tx) error {
		n, err := tx.LockNode(ctx, node.ID, "")
		if err != nil {
			return err
		}
		n.Version--
		return tx.UpdateNode(ctx, &n)
	})
	if !errors.Is(err, ErrStale) {
		t.Fatalf("an update at an older version: %v, want %v", err, ErrStale)
	}
}

// mangleNode puts the rowid of other's node in the cache's entry of r's node.
func mangleNode(tx *Tx, r, other *rowSet) error {
	rc := tx.rows()
	rc.apply()
	e, ok := rc.nodes.get(r.node.ID)
	if !ok {
		return errors.New("the node is not cached")
	}
	var err error
	e.row, err = rowidOf(tx, "nodes", other.node.ID)
	return err
}

// mangleWorkflow puts the rowid of other's workflow in the cache's entry of r's node's open
// workflow.
func mangleWorkflow(tx *Tx, r, other *rowSet) error {
	rc := tx.rows()
	rc.apply()
	w, ok := rc.open[r.node.ID]
	if !ok || !w.ok {
		return errors.New("the workflow is not cached")
	}
	var err error
	w.row, err = rowidOf(tx, "workflows", other.wf.ID)
	rc.open[r.node.ID] = w
	return err
}

// storedCols reads one text of a row as stored (q, by id), not through the writer's caches.
func storedCols(tx *Tx, q, id string) (string, error) {
	var s string
	if err := tx.queryRow(context.Background(), q, id).Scan(&s); err != nil {
		return "", fmt.Errorf("reading %s: %w", id, err)
	}
	return s, nil
}

// rowidOf reads the rowid of the row of table whose id is id.
func rowidOf(tx *Tx, table, id string) (int64, error) {
	var row int64
	err := tx.queryRow(context.Background(), `SELECT rowid FROM `+table+` WHERE id = ?`, id).Scan(&row)
	return row, err
}

// A claim and an acknowledgement of commands the writer's cache holds take them by their rowids
// (inRows), one command or several; with a wrong rowid in the cache (another node's command's)
// they still take every command asked for, and leave the other command alone.
func TestWriterClaimsAndDeliversCachedCommandsByTheirRowid(t *testing.T) {
	ctx := context.Background()
	for _, n := range []int{1, 3} {
		for _, wrong := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d commands, wrong rowid %v", n, wrong), func(t *testing.T) {
				s := openTempSQLite(t)
				var ids []string
				var other Command
				if err := s.Write(ctx, func(tx *Tx) error {
					pool, err := seedPool(ctx, tx)
					if err != nil {
						return err
					}
					for i, name := range []string{"a", "b"} {
						node := redfishNode(pool, name, "enrolling")
						if err := tx.InsertNode(ctx, &node); err != nil {
							return err
						}
						for range []int{n, 1}[i] {
							c := Command{NodeID: node.ID, TenantID: pool.TenantID, SiteID: pool.SiteID, Kind: "bmc.power", Subject: node.ID, RunsOn: "site"}
							if err := tx.InsertCommand(ctx, &c); err != nil {
								return err
							}
							if i == 0 {
								ids = append(ids, c.ID)
							} else {
								other = c
							}
						}
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				// prepare reads the commands into the writer's cache and, if wrong, puts the
				// other command's rowid in the first one's entry.
				prepare := func(tx *Tx) ([]Command, error) {
					var cands []Command
					for _, id := range append([]string{other.ID}, ids...) {
						c, err := tx.Command(ctx, id)
						if err != nil {
							return nil, err
						}
						if id != other.ID {
							cands = append(cands, c)
						}
					}
					if wrong {
						rc := tx.rows()
						e, ok := rc.cmds.get(ids[0])
						if !ok {
							return nil, errors.New("the command is not cached")
						}
						var err error
						e.row, err = rowidOf(tx, "commands", other.ID)
						return cands, err
					}
					return cands, nil
				}
				var claimed int
				var delivered map[string]bool
				if err := s.Write(ctx, func(tx *Tx) error {
					cands, err := prepare(tx)
					if err != nil {
						return err
					}
					got, err := tx.AssignCommands(ctx, "site-a", cands)
					claimed = len(got)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				if err := s.Write(ctx, func(tx *Tx) error {
					if _, err := prepare(tx); err != nil {
						return err
					}
					var err error
					delivered, err = tx.DeliverCommands(ctx, ids, Acknowledger{AgentID: "site-a"})
					return err
				}); err != nil {
					t.Fatal(err)
				}
				if claimed != n || len(delivered) != n {
					t.Errorf("claimed %d, delivered %d, want %d", claimed, len(delivered), n)
				}
				for _, id := range ids {
					if got, err := s.Command(ctx, id); err != nil || got.State != "delivered" || got.TargetAgent != "site-a" || got.Attempts != 1 {
						t.Errorf("command %s: %s to %q, %d attempts (%v); want delivered to site-a, 1", id, got.State, got.TargetAgent, got.Attempts, err)
					}
				}
				if got, err := s.Command(ctx, other.ID); err != nil || got.State != "queued" || got.TargetAgent != "" || got.Attempts != 0 {
					t.Errorf("the other command: %s to %q, %d attempts (%v); want it queued, free", got.State, got.TargetAgent, got.Attempts, err)
				}
				for _, prefix := range []string{"UPDATE OR FAIL commands SET target_agent = ?", "UPDATE OR FAIL commands SET state = 'delivered'"} {
					byRow := false
					for q := range s.lite.stmts {
						byRow = byRow || strings.HasPrefix(q, prefix) && strings.Contains(q, "rowid IN (")
					}
					if !byRow {
						t.Errorf("no statement %q… by rowid was prepared", prefix)
					}
				}
			})
		}
	}
}
