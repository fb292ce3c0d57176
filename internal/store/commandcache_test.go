package store

import (
	"context"
	"errors"
	"reflect"
	"testing"
)

// SQLite's writer keeps the commands it inserted, read or changed (workflowCache.cmds): a
// command's claim, acknowledgement and reports read it from memory. After each kind of change,
// by the statements that put the row back and by others the cache must drop it for, every row
// the cache holds is the row the database holds, and it holds the rows the writer knows.
func TestWriterCommandCacheHoldsWhatTheDatabaseHolds(t *testing.T) {
	ctx := context.Background()
	s, node := openWithNode(t)
	const site, nodeAgent = "site-a", "node-n"
	ids := map[string]string{} // by name: a, b (site commands), r (the node's ramdisk's)
	byNode := Acknowledger{AgentID: nodeAgent, Node: true, NodeID: node.ID, Generation: 1}
	command := func(tx *Tx, name string) (Command, error) { return tx.Command(ctx, ids[name]) }
	report := func(name, state string, progress string) func(tx *Tx) error {
		return func(tx *Tx) error {
			c, err := command(tx, name)
			if err != nil {
				return err
			}
			c.State, c.Progress = state, progress
			if state == "succeeded" {
				c.FinishedAt, c.Result = tx.At(), `{"ok":true}`
			}
			return tx.ReportCommand(ctx, &c)
		}
	}
	errUndone := errors.New("undone")
	steps := []cacheStep{ // (cached: the commands the cache holds after the step)
		{"commands queued", func(tx *Tx) error {
			for _, c := range []Command{
				{NodeID: node.ID, TenantID: node.TenantID, SiteID: node.SiteID, Kind: "bmc.power", Subject: node.ID, RunsOn: "site", Args: `{"op":"on"}`, Deadline: 9},
				{NodeID: node.ID, TenantID: node.TenantID, SiteID: node.SiteID, Kind: "bmc.boot", Subject: node.ID, RunsOn: "site", Reroutable: true},
				{NodeID: node.ID, TenantID: node.TenantID, SiteID: node.SiteID, Kind: "disk.wipe", Subject: node.ID, RunsOn: "ramdisk", Generation: 1, Destructive: true, Attested: true},
			} {
				if err := tx.InsertCommand(ctx, &c); err != nil {
					return err
				}
				ids[map[string]string{"bmc.power": "a", "bmc.boot": "b", "disk.wipe": "r"}[c.Kind]] = c.ID
			}
			return nil
		}, false, []string{"a", "b", "r"}},
		{"one command assigned", func(tx *Tx) error {
			c, err := command(tx, "a")
			if err != nil {
				return err
			}
			got, err := tx.AssignCommands(ctx, site, []Command{c})
			if err == nil && (len(got) != 1 || got[0].Attempts != 1) {
				err = errors.New("the command was not assigned with an attempt")
			}
			return err
		}, false, []string{"a", "b", "r"}},
		{"two assigned, one of them again", func(tx *Tx) error {
			a, err := command(tx, "a")
			if err != nil {
				return err
			}
			b, err := command(tx, "b")
			if err != nil {
				return err
			}
			_, err = tx.AssignCommands(ctx, site, []Command{a, b})
			return err
		}, false, []string{"a", "b", "r"}},
		{"one delivered to its agent", func(tx *Tx) error {
			_, err := tx.DeliverCommands(ctx, []string{ids["a"]}, Acknowledger{AgentID: site})
			return err
		}, false, []string{"a", "b", "r"}},
		{"the node agent takes its ramdisk's command, not the site's", func(tx *Tx) error {
			done, err := tx.DeliverCommands(ctx, []string{ids["b"], ids["r"]}, byNode)
			if err == nil && (!done[ids["r"]] || done[ids["b"]]) {
				err = errors.New("delivered the wrong commands")
			}
			return err
		}, false, []string{"a", "b", "r"}},
		{"a report with progress", report("r", "running", `{"done":1,"total":2}`), false, []string{"a", "b", "r"}},
		{"another statement moves a command's deadline", func(tx *Tx) error {
			_, err := tx.exec(ctx, `UPDATE commands SET deadline = deadline + 5 WHERE id = ?`, ids["a"])
			return err
		}, false, []string{"b", "r"}},
		{"a command read again", func(tx *Tx) error {
			_, err := command(tx, "a")
			return err
		}, false, []string{"a", "b", "r"}},
		{"a report, then the write fails", func(tx *Tx) error {
			if err := report("r", "running", `{"done":2,"total":2}`)(tx); err != nil {
				return err
			}
			if _, err := command(tx, "r"); err != nil {
				return err
			}
			return errUndone
		}, true, nil},
		{"the commands read again", func(tx *Tx) error {
			for _, n := range []string{"a", "b", "r"} {
				if _, err := command(tx, n); err != nil {
					return err
				}
			}
			return nil
		}, false, []string{"a", "b", "r"}},
		{"a command ends", report("r", "succeeded", ""), false, []string{"a", "b"}},
		{"the control plane fails a command", func(tx *Tx) error {
			c, err := command(tx, "b")
			if err != nil {
				return err
			}
			c.State, c.Error = "failed", "given up"
			return tx.UpdateCommand(ctx, &c)
		}, false, []string{"a"}},
		{"a statement of many commands", func(tx *Tx) error {
			_, err := tx.exec(ctx, `UPDATE commands SET progress = 'x' WHERE node_id = ?`, node.ID)
			return err
		}, false, nil},
		{"a command read, then removed", func(tx *Tx) error {
			if _, err := command(tx, "a"); err != nil {
				return err
			}
			_, err := tx.exec(ctx, `DELETE FROM commands WHERE id = ?`, ids["a"])
			return err
		}, false, nil},
	}
	// Every cached row is the stored one, and the cache holds what the step says.
	runCacheSteps(t, s, ids, steps, func(tx *Tx, step string) (held []string) {
		for id, c := range tx.rows().cmds.byKey {
			var row int64
			var stored Command
			var gen int64
			if err := scanCommandInto(tx.queryRow(ctx, commandRowQuery, id), &stored, &gen, []any{&row}); err != nil {
				t.Errorf("%s: cached command %s: %v", step, id, err)
				continue
			}
			if !reflect.DeepEqual(c.c, stored) || c.row != row {
				t.Errorf("%s: cached command %s at row %d\n %+v\nstored at row %d\n %+v", step, id, c.row, c.c, row, stored)
			}
			held = append(held, id)
		}
		return held
	})
}

// A report on a command the writer holds reads nothing: the claim, the acknowledgement and each
// report take the row from memory, and the claim of one command no longer reads its attempts.
func TestWriterReportsOnACachedCommandReadNothing(t *testing.T) {
	ctx := context.Background()
	s, node := openWithNode(t)
	c := Command{NodeID: node.ID, TenantID: node.TenantID, SiteID: node.SiteID, Kind: "bmc.power", Subject: node.ID, RunsOn: "site"}
	if err := s.Write(ctx, func(tx *Tx) error { return tx.InsertCommand(ctx, &c) }); err != nil {
		t.Fatal(err)
	}
	// ran runs f in a write and returns the statements it ran.
	ran := func(f func(tx *Tx) error) int64 {
		t.Helper()
		var n int64
		if err := s.Write(ctx, func(tx *Tx) error {
			before := s.WriterStats().Statements
			err := f(tx)
			n = s.WriterStats().Statements - before
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}
	hits := s.WriterStats().CommandHits
	if n := ran(func(tx *Tx) error { _, err := tx.AssignCommands(ctx, "site-a", []Command{c}); return err }); n != 1 {
		t.Errorf("claim of a cached command: %d statements, want 1 (the assignment)", n)
	}
	if n := ran(func(tx *Tx) error {
		_, err := tx.DeliverCommands(ctx, []string{c.ID}, Acknowledger{AgentID: "site-a"})
		return err
	}); n != 1 {
		t.Errorf("acknowledgement: %d statements, want 1", n)
	}
	for _, state := range []string{"running", "succeeded"} {
		if n := ran(func(tx *Tx) error {
			got, err := tx.Command(ctx, c.ID)
			if err != nil {
				return err
			}
			if got.TargetAgent != "site-a" || got.Attempts != 1 || got.DeliveredAt == 0 {
				t.Errorf("%s: read %+v, want it assigned, with an attempt, delivered", state, got)
			}
			got.State = state
			return tx.ReportCommand(ctx, &got)
		}); n != 1 {
			t.Errorf("report %s: %d statements, want 1 (the update)", state, n)
		}
	}
	if got := s.WriterStats().CommandHits - hits; got != 2 {
		t.Errorf("%d reads found in the cache, want 2", got)
	}
	// Ended: the next read goes to the database.
	if n := ran(func(tx *Tx) error { _, err := tx.Command(ctx, c.ID); return err }); n != 1 {
		t.Errorf("read of an ended command: %d statements, want 1", n)
	}
}
