package store_test

import (
	"context"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestLingerAndWithdraw: a node's linger fields round-trip; a ramdisk command no agent was
// offered is withdrawn, one an agent claimed is not, and only an offered power-off counts as
// the node's last boot command.
func TestLingerAndWithdraw(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		n := nodes[0]
		err := st.Write(ctx, func(tx *store.Tx) error {
			got, err := tx.LockNode(ctx, n.ID, "")
			if err != nil {
				return err
			}
			got.LingerUntil, got.LingerCommand = 12345, "c-1"
			return tx.UpdateNode(ctx, &got)
		})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := st.Node(ctx, n.ID, ""); err != nil || got.LingerUntil != 12345 || got.LingerCommand != "c-1" {
			t.Fatalf("linger fields: %d %q (%v)", got.LingerUntil, got.LingerCommand, err)
		}
		off := func() store.Command {
			return store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: "ramdisk.powerOff", Subject: n.ID, Args: "{}",
				RunsOn: "ramdisk", Generation: n.IdentityGeneration}
		}
		a, b := off(), off()
		var lastBoot int64
		err = st.Write(ctx, func(tx *store.Tx) error {
			if err := tx.InsertCommand(ctx, &a); err != nil {
				return err
			}
			if err := tx.InsertCommand(ctx, &b); err != nil {
				return err
			}
			lastBoot, err = tx.LastBootCommandAt(ctx, n.ID)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if lastBoot != 0 {
			t.Errorf("a power-off no agent was offered counts as a boot command (%d)", lastBoot)
		}
		// The ramdisk claims one of them.
		err = st.Write(ctx, func(tx *store.Tx) error {
			cs, err := tx.ClaimCommands(ctx, "node:"+n.ID, "node", "", n.ID, n.IdentityGeneration, 1)
			if err != nil || len(cs) != 1 {
				t.Fatalf("claimed %d (%v), want 1", len(cs), err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		a, _ = st.Command(ctx, a.ID)
		claimed, unclaimed := a, b
		if a.TargetAgent == "" {
			claimed, _ = st.Command(ctx, b.ID)
			unclaimed = a
		}
		err = st.Write(ctx, func(tx *store.Tx) error {
			if closed, offered, err := tx.WithdrawCommand(ctx, unclaimed.ID, "test"); err != nil || !closed || offered {
				t.Errorf("withdrawing an unclaimed command: closed %v offered %v %v, want closed, not offered", closed, offered, err)
			}
			if closed, _, err := tx.WithdrawCommand(ctx, unclaimed.ID, "test"); err != nil || closed {
				t.Errorf("withdrawing twice: closed %v %v", closed, err)
			}
			lastBoot, err = tx.LastBootCommandAt(ctx, n.ID)
			if err != nil {
				return err
			}
			if closed, offered, err := tx.WithdrawCommand(ctx, claimed.ID, "test"); err != nil || !closed || !offered {
				t.Errorf("withdrawing a claimed, unacknowledged command: closed %v offered %v %v, want both", closed, offered, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// Closed, it is offered to no agent again (the gateway's node agents keep their id
		// across boots).
		err = st.Write(ctx, func(tx *store.Tx) error {
			cs, err := tx.ClaimCommands(ctx, "node:"+n.ID, "node", "", n.ID, n.IdentityGeneration, 10)
			if err != nil || len(cs) != 0 {
				t.Errorf("claimed %d (%v) after withdrawal, want none", len(cs), err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// Acknowledged, it is left alone.
		c := off()
		err = st.Write(ctx, func(tx *store.Tx) error {
			c.State, c.TargetAgent = "delivered", "node:"+n.ID
			if err := tx.InsertCommand(ctx, &c); err != nil {
				return err
			}
			if closed, _, err := tx.WithdrawCommand(ctx, c.ID, "test"); err != nil || closed {
				t.Errorf("withdrawing an acknowledged command: closed %v %v", closed, err)
			}
			up, err := tx.AgentConnected(ctx, "node:"+n.ID)
			if err != nil || up {
				t.Errorf("AgentConnected of an agent never seen: %v %v", up, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if lastBoot != claimed.CreatedAt {
			t.Errorf("last boot command at %d, want the offered power-off's %d", lastBoot, claimed.CreatedAt)
		}
		if c, _ := st.Command(ctx, unclaimed.ID); c.State != "failed" || c.Error != "test" {
			t.Errorf("withdrawn command: %s %q", c.State, c.Error)
		}
	})
}
