package engine

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// The reaper lists the agents departed longer than the grace period, then applies each one's
// departure. On PostgreSQL an agent of that list may connect again (a new boot of a node's
// ramdisk, after a store outage kept it away) and acknowledge a command on its new connection
// before the reaper reaches it: that command is the new connection's, and must not be lost as
// the departed connection's (TestStoreOutage lost a boot.kexec so). Here the reaper is held on
// another departed agent listed before it (a row lock the test holds) while the ramdisk
// reconnects and acknowledges its wipe. SQLite's single writer cannot interleave them.
func TestReaperLeavesAnAgentBackSinceItsList(t *testing.T) {
	ctx := context.Background()
	dsn := storetest.DSN(t, store.Postgres)
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })

	f := newWFFixture(t, st, "inspecting", "ready", []workflow.Step{{Use: "disk.wipe", Args: map[string]string{"mode": "quick"}, Timeout: 24 * time.Hour}}, nil,
		Config{AgentGrace: 15 * time.Second})
	f.run(t)
	// The node's ramdisk connects and goes away before it took anything.
	first := Agent{ID: "node:" + f.node.ID, Kind: "node", NodeID: f.node.ID, Generation: f.node.IdentityGeneration, ConnID: "boot-1"}
	if err := f.e.Connected(ctx, first, "v"); err != nil {
		t.Fatal(err)
	}
	if err := f.e.Disconnected(ctx, first); err != nil {
		t.Fatal(err)
	}
	// Another agent, listed first (ids in order), departs holding a command it acknowledged.
	blocker := store.Command{NodeID: f.node.ID, TenantID: f.node.TenantID, SiteID: f.node.SiteID, Kind: "bmc.query", Args: "{}", RunsOn: "site",
		TargetAgent: "a-site", State: "delivered"}
	if err := st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.UpsertAgent(ctx, store.Agent{ID: "a-site", Kind: "site", SiteID: f.node.SiteID, ConnID: "a1"}); err != nil {
			return err
		}
		if err := tx.InsertCommand(ctx, &blocker); err != nil {
			return err
		}
		return tx.AgentGone(ctx, "a-site", "a1")
	}); err != nil {
		t.Fatal(err)
	}
	f.clock.Add(20 * time.Second) // both past the grace period

	// Hold the reaper on the other agent's command, once it has listed both.
	hold, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Rollback()
	var holder int
	if err := hold.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	if _, err := hold.ExecContext(ctx, `SELECT id FROM commands WHERE id = $1 FOR UPDATE`, blocker.ID); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan error, 1)
	go func() { reaped <- f.e.reapAgents(ctx) }()
	storetest.AwaitBlocked(t, db, holder, func() error {
		select {
		case err := <-reaped:
			return fmt.Errorf("the reaper returned (%v) before it reached the held command", err)
		default:
			return nil
		}
	})

	// Meanwhile the ramdisk connects again and acknowledges its wipe.
	second := first
	second.ConnID = "boot-2"
	if err := f.e.Connected(ctx, second, "v"); err != nil {
		t.Fatal(err)
	}
	cmds, err := f.e.Claim(ctx, second, 10)
	if err != nil || len(cmds) != 1 || cmds[0].Kind != "disk.wipe" {
		t.Fatalf("claimed %+v, %v; want the wipe", cmds, err)
	}
	if err := f.e.Ack(ctx, second, cmds[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := hold.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-reaped; err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		id, want string
	}{
		{cmds[0].ID, "delivered"}, // the new connection's
		{blocker.ID, "lost"},      // the departed agent's
	} {
		got, err := st.Command(ctx, c.id)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != c.want {
			t.Errorf("command %s (%s) is %s after the reaper, want %s (%s)", c.id, got.Kind, got.State, c.want, got.Error)
		}
	}
	if n := f.e.CommandsLost(); n != 1 {
		t.Errorf("commands counted lost: %d, want 1 (the departed agent's)", n)
	}
}
