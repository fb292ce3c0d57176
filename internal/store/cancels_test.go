package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// The control plane's write that fails a command its agent acknowledged records the agent's
// cancel in the row (Tx.UpdateCommand), listed for the agent and for the server holding its
// connection until the agent reports on it or it expires; no other write requests one.
func TestCancelRequestedByTheWriteThatGivesUp(t *testing.T) {
	for _, tc := range []struct {
		name string
		// state the command is in (delivered, running: acknowledged) before the write.
		state string
		// write ends it: the control plane (UpdateCommand) or the agent (ReportCommand).
		byAgent bool
		to      string
		want    bool
	}{
		{"given up while delivered", "delivered", false, "failed", true},
		{"given up while running", "running", false, "failed", true},
		{"given up before acknowledged", "queued", false, "failed", false},
		{"failed by its agent", "running", true, "failed", false},
		{"closed as succeeded (self-terminating)", "delivered", false, "succeeded", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				_, nodes := seed(t, st)
				c := store.Command{NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, SiteID: nodes[0].SiteID, Kind: "disk.wipe", Args: "{}",
					RunsOn: "ramdisk", TargetAgent: "node:" + nodes[0].ID, State: tc.state}
				writeCancels(t, st, func(tx *store.Tx) error {
					if err := tx.UpsertAgent(ctx, store.Agent{ID: c.TargetAgent, Kind: "node", NodeID: c.NodeID, ConnID: "c1", ServerID: "server-b"}); err != nil {
						return err
					}
					return tx.InsertCommand(ctx, &c)
				})
				c.State, c.Error, c.FinishedAt = tc.to, "workflow aborted", 1
				writeCancels(t, st, func(tx *store.Tx) error {
					if tc.byAgent {
						return tx.ReportCommand(ctx, &c)
					}
					return tx.UpdateCommand(ctx, &c)
				})
				pending, err := st.PendingCancels(ctx, c.TargetAgent)
				if err != nil {
					t.Fatal(err)
				}
				served, err := st.ServerCancels(ctx, "server-b")
				if err != nil {
					t.Fatal(err)
				}
				other, err := st.ServerCancels(ctx, "server-a")
				if err != nil {
					t.Fatal(err)
				}
				if len(other) != 0 {
					t.Errorf("a server the agent is not connected to lists %+v", other)
				}
				if !tc.want {
					if len(pending)+len(served) != 0 {
						t.Fatalf("cancels requested: %+v, %+v; want none", pending, served)
					}
					return
				}
				want := []store.Cancel{{CommandID: c.ID, AgentID: c.TargetAgent, NodeID: c.NodeID, SiteID: c.SiteID, RunsOn: "ramdisk", RequestedAt: pending[0].RequestedAt}}
				if !slices.Equal(pending, want) || !slices.Equal(served, want) || pending[0].RequestedAt == 0 {
					t.Fatalf("agent's cancels %+v, server's %+v; want %+v", pending, served, want)
				}
				// Another agent's report ends nothing; the agent's own does.
				writeCancels(t, st, func(tx *store.Tx) error { return tx.CancelReported(ctx, c.ID, "node:other") })
				if p, _ := st.PendingCancels(ctx, c.TargetAgent); len(p) != 1 {
					t.Fatalf("after another agent's report: %+v", p)
				}
				writeCancels(t, st, func(tx *store.Tx) error { return tx.CancelReported(ctx, c.ID, c.TargetAgent) })
				if p, _ := st.PendingCancels(ctx, c.TargetAgent); len(p) != 0 {
					t.Fatalf("after the agent's report: %+v", p)
				}
			})
		})
	}
}

// A cancel nobody reports on ends after its time (Tx.ExpireCancels), and only then.
func TestCancelsExpire(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
		st.SetClock(func() time.Time { return now })
		_, nodes := seed(t, st)
		c := store.Command{NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, SiteID: nodes[0].SiteID, Kind: "bmc.power", Args: "{}",
			RunsOn: "site", TargetAgent: "site-agent", State: "running"}
		writeCancels(t, st, func(tx *store.Tx) error { return tx.InsertCommand(ctx, &c) })
		c.State = "failed"
		writeCancels(t, st, func(tx *store.Tx) error { return tx.UpdateCommand(ctx, &c) })
		at := now.UnixMicro()
		writeCancels(t, st, func(tx *store.Tx) error { return tx.ExpireCancels(ctx, at) })
		if p, _ := st.PendingCancels(ctx, "site-agent"); len(p) != 1 {
			t.Fatalf("expired at its own time: %+v", p)
		}
		writeCancels(t, st, func(tx *store.Tx) error { return tx.ExpireCancels(ctx, at+1) })
		if p, _ := st.PendingCancels(ctx, "site-agent"); len(p) != 0 {
			t.Fatalf("not expired after its time: %+v", p)
		}
	})
}

// A node agent's connection with another key than its last is another boot
// (Tx.NodeAgentBoot); the previous boot's acknowledged commands are lost and its cancels end
// (Tx.LosePreviousBoot), what it never acknowledged stays queued, and other agents' commands
// are untouched.
func TestPreviousBootsCommandsLost(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		agent := "node:" + nodes[0].ID
		boot := func(key string) bool {
			t.Helper()
			var rebooted bool
			writeCancels(t, st, func(tx *store.Tx) error {
				if err := tx.UpsertAgent(ctx, store.Agent{ID: agent, Kind: "node", NodeID: nodes[0].ID, ConnID: key}); err != nil {
					return err
				}
				var err error
				rebooted, err = tx.NodeAgentBoot(ctx, agent, key)
				return err
			})
			return rebooted
		}
		for _, step := range []struct {
			key  string
			want bool
		}{{"k1", false}, {"k1", false}, {"k2", true}, {"k2", false}, {"k1", true}} {
			if got := boot(step.key); got != step.want {
				t.Fatalf("connecting with key %s: another boot %v, want %v", step.key, got, step.want)
			}
		}
		cmds := map[string]*store.Command{}
		for _, s := range []struct{ name, state, agent string }{
			{"queued", "queued", agent}, {"delivered", "delivered", agent}, {"running", "running", agent},
			{"done", "succeeded", agent}, {"given up", "running", agent}, {"other", "running", "node:other"},
		} {
			c := &store.Command{NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, SiteID: nodes[0].SiteID, Kind: "disk.wipe", Args: "{}",
				RunsOn: "ramdisk", TargetAgent: s.agent, State: s.state}
			writeCancels(t, st, func(tx *store.Tx) error { return tx.InsertCommand(ctx, c) })
			cmds[s.name] = c
		}
		g := cmds["given up"]
		g.State = "failed"
		writeCancels(t, st, func(tx *store.Tx) error { return tx.UpdateCommand(ctx, g) })
		if p, _ := st.PendingCancels(ctx, agent); len(p) != 1 {
			t.Fatalf("cancels before the new boot: %+v", p)
		}
		var lost []store.Command
		writeCancels(t, st, func(tx *store.Tx) error {
			var err error
			lost, err = tx.LosePreviousBoot(ctx, agent, "rebooted")
			return err
		})
		var ids []string
		for _, c := range lost {
			if c.State != "lost" || c.Error != "rebooted" || c.FinishedAt == 0 {
				t.Errorf("lost command %s written as %s (%q, finished %d)", c.ID, c.State, c.Error, c.FinishedAt)
			}
			ids = append(ids, c.ID)
		}
		slices.Sort(ids)
		want := []string{cmds["delivered"].ID, cmds["running"].ID}
		slices.Sort(want)
		if !slices.Equal(ids, want) {
			t.Fatalf("lost %v, want the delivered and running ones %v", ids, want)
		}
		for name, wantState := range map[string]string{"queued": "queued", "delivered": "lost", "running": "lost", "done": "succeeded", "given up": "failed", "other": "running"} {
			c, err := st.Command(ctx, cmds[name].ID)
			if err != nil || c.State != wantState {
				t.Errorf("%s command: %s (%v), want %s", name, c.State, err, wantState)
			}
		}
		if p, _ := st.PendingCancels(ctx, agent); len(p) != 0 {
			t.Errorf("the previous boot's cancels after the new boot: %+v", p)
		}
	})
}

// On SQLite a boot that left nothing behind costs its successor one read: the updates that would
// end the previous boot's commands and cancels run only for what there is (each collects its
// rows into a temporary table first, even for none).
func TestPreviousBootWithNothingLeftOnlyReads(t *testing.T) {
	st := storetest.Open(t, store.SQLite)
	ctx := context.Background()
	_, nodes := seed(t, st)
	agent := "node:" + nodes[0].ID
	lose := func() (lost []store.Command, statements int64) {
		t.Helper()
		before := st.WriterStats().Statements
		writeCancels(t, st, func(tx *store.Tx) error {
			var err error
			lost, err = tx.LosePreviousBoot(ctx, agent, "rebooted")
			return err
		})
		return lost, st.WriterStats().Statements - before
	}
	if lost, n := lose(); len(lost) != 0 || n != 3 {
		t.Errorf("nothing left: lost %d commands in %d statements, want none in 3 (BEGIN, the read, COMMIT)", len(lost), n)
	}
	c := &store.Command{NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, SiteID: nodes[0].SiteID, Kind: "disk.wipe", Args: "{}",
		RunsOn: "ramdisk", TargetAgent: agent, State: "running"}
	writeCancels(t, st, func(tx *store.Tx) error { return tx.InsertCommand(ctx, c) })
	if lost, n := lose(); len(lost) != 1 || lost[0].ID != c.ID || n != 4 {
		t.Errorf("a running command left: lost %d commands in %d statements, want it in 4 (and the update)", len(lost), n)
	}
}

func writeCancels(t *testing.T, st *store.Store, f func(tx *store.Tx) error) {
	t.Helper()
	if err := st.Write(context.Background(), f); err != nil {
		t.Fatal(err)
	}
}

// Migration 00043 adds commands.cancel_requested_at (0 for the rows there), its index of
// pending cancels and agents.key_sha256 (empty) to a store holding rows; its Down removes them,
// and it applies again after that.
func TestDurableCancelsMigration(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			ctx := context.Background()
			_, db, p := migrationProvider(t, e)
			index := `SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() AND indexname = 'commands_cancel_pending'`
			if e == store.SQLite {
				index = `SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'commands_cancel_pending'`
			}
			if _, err := p.UpTo(ctx, 42); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `INSERT INTO commands (id, node_id, tenant_id, site_id, kind, subject, state, target_agent, created_at, updated_at)
				VALUES ('c1', 'n1', 't1', 's1', 'disk.wipe', 'n1', 'failed', 'node:n1', 1, 1)`); err != nil {
				t.Fatal(err)
			}
			if _, err := db.ExecContext(ctx, `INSERT INTO agents (id, kind, node_id) VALUES ('node:n1', 'node', 'n1')`); err != nil {
				t.Fatal(err)
			}
			applied := func(want bool) {
				t.Helper()
				var n int
				if err := db.QueryRowContext(ctx, index).Scan(&n); err != nil {
					t.Fatal(err)
				}
				var at int64
				var key string
				cerr := db.QueryRowContext(ctx, `SELECT cancel_requested_at FROM commands WHERE id = 'c1'`).Scan(&at)
				kerr := db.QueryRowContext(ctx, `SELECT key_sha256 FROM agents WHERE id = 'node:n1'`).Scan(&key)
				if want && (n != 1 || cerr != nil || kerr != nil || at != 0 || key != "") {
					t.Fatalf("applied: index %d, cancel_requested_at %d (%v), key_sha256 %q (%v)", n, at, cerr, key, kerr)
				}
				if !want && (n != 0 || cerr == nil || kerr == nil) {
					t.Fatalf("rolled back: index %d, cancel_requested_at readable: %v, key_sha256 readable: %v", n, cerr == nil, kerr == nil)
				}
			}
			for _, s := range []struct {
				name string
				run  func() error
				want bool
			}{
				{"up", func() error { _, err := p.UpTo(ctx, 43); return err }, true},
				{"down", func() error { _, err := p.DownTo(ctx, 42); return err }, false},
				{"up again", func() error { _, err := p.UpTo(ctx, 43); return err }, true},
			} {
				if err := s.run(); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				applied(s.want)
			}
		})
	}
}
