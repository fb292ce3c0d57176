package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

func TestBatches(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		pool, nodes := seed(t, st)
		write := func(f func(tx *store.Tx) error) {
			t.Helper()
			if err := st.Write(ctx, f); err != nil {
				t.Fatal(err)
			}
		}

		// Policies: a node needs the largest of installation, site and pool.
		write(func(tx *store.Tx) error {
			if err := tx.SetApprovalPolicy(ctx, "installation", 1, "a"); err != nil {
				return err
			}
			if err := tx.SetApprovalPolicy(ctx, store.ApprovalScope("pool", pool.ID), 3, "a"); err != nil {
				return err
			}
			if err := tx.SetApprovalPolicy(ctx, store.ApprovalScope("site", pool.SiteID), 2, "a"); err != nil {
				return err
			}
			for _, c := range []struct {
				site, pool string
				want       int
			}{{pool.SiteID, pool.ID, 3}, {pool.SiteID, "other", 2}, {"other", "other", 1}} {
				got, err := tx.RequiredApprovals(ctx, c.site, c.pool)
				if err != nil || got != c.want {
					return fmt.Errorf("required for %s/%s = %d, want %d (%v)", c.site, c.pool, got, c.want, err)
				}
			}
			if err := tx.SetApprovalPolicy(ctx, "installation", 0, "a"); err != nil {
				return err
			}
			got, err := tx.RequiredApprovals(ctx, "other", "other")
			if err != nil || got != 0 {
				return fmt.Errorf("after removal: %d %v", got, err)
			}
			return nil
		})

		// A batch with more leaves than one statement carries, duplicates dropped.
		var leaves []store.Leaf
		for i := range 1000 {
			leaves = append(leaves, store.Leaf{Subject: fmt.Sprintf("n%d", i), Kind: "disk.wipe"})
		}
		leaves = append(leaves, leaves[0])
		b := store.Batch{TenantID: pool.TenantID, SiteID: pool.SiteID, PoolID: pool.ID, Kind: "bulk", Verb: "retire", RequestedBy: "token:ops", Required: 2, Size: 1000}
		write(func(tx *store.Tx) error { return tx.InsertBatch(ctx, &b, leaves) })
		if b.State != store.BatchPending || b.Leaves != 1000 {
			t.Fatalf("batch: %s with %d leaves", b.State, b.Leaves)
		}
		write(func(tx *store.Tx) error { return tx.AddApproval(ctx, b.ID, "token:a") })
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.AddApproval(ctx, b.ID, "token:a") }); !errors.Is(err, store.ErrConflict) {
			t.Fatalf("second approval by the same approver: %v", err)
		}
		write(func(tx *store.Tx) error {
			for _, c := range []struct {
				subject string
				want    bool
			}{{"n0", true}, {"n999", true}, {"n1000", false}} {
				got, err := tx.LeafInScope(ctx, b.ID, c.subject, "disk.wipe")
				if err != nil || got != c.want {
					return fmt.Errorf("leaf %s: %v %v", c.subject, got, err)
				}
			}
			if err := tx.AddApproval(ctx, b.ID, "token:b"); err != nil {
				return err
			}
			if had, err := tx.RemoveApproval(ctx, b.ID, "token:b"); !had || err != nil {
				return fmt.Errorf("withdraw: %v %v", had, err)
			}
			n, err := tx.CountApprovals(ctx, b.ID)
			if err != nil || n != 1 {
				return fmt.Errorf("approvals = %d %v", n, err)
			}
			// Parked on a node; a held command released on approval.
			nd, err := tx.LockNode(ctx, nodes[0].ID, "")
			if err != nil {
				return err
			}
			nd.BatchID, nd.VerbFrom, nd.VerbBy, nd.Conditions = b.ID, "ready", "token:ops", map[string]string{"BmcCredentialRotated": "False"}
			if err := tx.UpdateNode(ctx, &nd); err != nil {
				return err
			}
			c := store.Command{NodeID: nd.ID, TenantID: nd.TenantID, SiteID: nd.SiteID, Kind: "bmc.power", Subject: "bmc:x", RunsOn: "site", State: "held", BatchID: b.ID}
			if err := tx.InsertCommand(ctx, &c); err != nil {
				return err
			}
			b.State = store.BatchApproved
			if err := tx.UpdateBatch(ctx, &b); err != nil {
				return err
			}
			if err := tx.ReleaseHeldCommands(ctx, b.ID); err != nil {
				return err
			}
			ids, err := tx.NodesOfBatch(ctx, b.ID)
			if err != nil || len(ids) != 1 || ids[0] != nd.ID {
				return fmt.Errorf("nodes of batch: %v %v", ids, err)
			}
			if err := tx.AppendEvents(ctx, []store.Event{{TenantID: nd.TenantID, NodeID: nd.ID, Actor: "t", Kind: "x"}, {TenantID: nd.TenantID, Actor: "t", Kind: "y"}}); err != nil {
				return err
			}
			return tx.WakeMany(ctx, []string{nodes[1].ID, nodes[2].ID}, "bulk")
		})
		got, err := st.Batch(ctx, b.ID)
		if err != nil || got.State != store.BatchApproved || got.Parked != 1 || len(got.Approvers) != 1 || got.Approvers[0] != "token:a" {
			t.Fatalf("batch read back: %+v %v", got, err)
		}
		cmds, _ := st.Commands(ctx, nodes[0].ID, 10)
		if len(cmds) != 1 || cmds[0].State != "queued" || cmds[0].BatchID != b.ID {
			t.Fatalf("held command after approval: %+v", cmds)
		}
		n0, _ := st.Node(ctx, nodes[0].ID, "")
		if n0.VerbFrom != "ready" || n0.VerbBy != "token:ops" || n0.Conditions["BmcCredentialRotated"] != "False" {
			t.Fatalf("node columns: %+v", n0)
		}
		list, err := st.Batches(ctx, store.BatchFilter{State: store.BatchApproved})
		if err != nil || len(list) != 1 {
			t.Fatalf("batches: %d %v", len(list), err)
		}
		// MoveNodes moves only the nodes still in the state the move was decided on.
		write(func(tx *store.Tx) error {
			n2, err := tx.LockNode(ctx, nodes[2].ID, "")
			if err != nil {
				return err
			}
			n2.State = "ready" // changed "meanwhile"
			if err := tx.UpdateNode(ctx, &n2); err != nil {
				return err
			}
			moved, err := tx.MoveNodes(ctx, []string{nodes[1].ID, nodes[2].ID}, store.BulkMove{FromState: "enrolling", FromTarget: "ready",
				State: "retiring", TargetState: "retired", ChainVerb: "retire", SetChain: true, VerbFrom: "enrolling", VerbBy: "token:ops", SetVerb: true,
				BatchID: b.ID, SetBatch: true})
			if err != nil {
				return err
			}
			if !moved[nodes[1].ID] || moved[nodes[2].ID] {
				return fmt.Errorf("moved %v", moved)
			}
			return nil
		})
		n1, _ := st.Node(ctx, nodes[1].ID, "")
		if n1.State != "retiring" || n1.TargetState != "retired" || n1.BatchID != b.ID || n1.VerbBy != "token:ops" || n1.Version != nodes[1].Version+1 {
			t.Fatalf("moved node: %+v", n1)
		}
		wus, _ := st.WakeUps(ctx, 10)
		if len(wus) < 2 {
			t.Fatalf("wake-ups: %v", wus)
		}
	})
}

// TestBatchImagePinsAndExpiry: a batch keeps the image (name and digest) its deploy writes, a
// node the digest its deploy verb pinned (outside the node's other columns: UpdateNode keeps
// it); an approval withdrawn holds the batch's queued commands again; the pending batches no
// workflow looks at are listed once past the deadline, not those parked on a node or under an
// open workflow.
func TestBatchImagePinsAndExpiry(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		pool, nodes := seed(t, st)
		mk := func(tx *store.Tx, kind string) (store.Batch, error) {
			b := store.Batch{TenantID: pool.TenantID, SiteID: pool.SiteID, PoolID: pool.ID, Kind: "node", Verb: kind, RequestedBy: "token:ops", Required: 1, Size: 1,
				Image: "debian-12", ImageDigest: "sha256:" + fmt.Sprintf("%064x", 7)}
			return b, tx.InsertBatch(ctx, &b, []store.Leaf{{Subject: "bmc:sa/x", Kind: kind}})
		}
		var direct, parked, deserted store.Batch
		var cmd store.Command
		err := st.Write(ctx, func(tx *store.Tx) error {
			var err error
			if direct, err = mk(tx, "bmc.power"); err != nil {
				return err
			}
			if parked, err = mk(tx, "metal-deploy"); err != nil {
				return err
			}
			if deserted, err = mk(tx, "bmc.power"); err != nil {
				return err
			}
			n, err := tx.LockNode(ctx, nodes[0].ID, "")
			if err != nil {
				return err
			}
			n.BatchID = parked.ID
			if err := tx.PinDeployImage(ctx, n.ID, direct.ImageDigest); err != nil {
				return err
			}
			if err := tx.UpdateNode(ctx, &n); err != nil {
				return err
			}
			cmd = store.Command{NodeID: nodes[1].ID, TenantID: pool.TenantID, SiteID: pool.SiteID, Kind: "bmc.power", Subject: "bmc:x", RunsOn: "site", State: "queued", BatchID: direct.ID, TargetAgent: "sa"}
			return tx.InsertCommand(ctx, &cmd)
		})
		if err != nil {
			t.Fatal(err)
		}
		if b, err := st.Batch(ctx, direct.ID); err != nil || b.Image != "debian-12" || b.ImageDigest != direct.ImageDigest {
			t.Fatalf("batch image read back: %q %q %v", b.Image, b.ImageDigest, err)
		}
		err = st.Write(ctx, func(tx *store.Tx) error {
			pin, err := tx.DeployImagePin(ctx, nodes[0].ID)
			if err != nil || pin != direct.ImageDigest {
				return fmt.Errorf("pin after UpdateNode: %q %v", pin, err)
			}
			if pin, err := tx.DeployImagePin(ctx, nodes[1].ID); err != nil || pin != "" {
				return fmt.Errorf("unpinned node: %q %v", pin, err)
			}
			if _, err := tx.DeployImagePin(ctx, "nope"); !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("unknown node: %v", err)
			}
			held, err := tx.HoldQueuedCommands(ctx, direct.ID)
			if err != nil || held != 1 {
				return fmt.Errorf("held again: %d %v", held, err)
			}
			for _, c := range []struct {
				createdBy int64
				want      []string
			}{
				{direct.CreatedAt - 1, nil},
				{tx.At(), []string{direct.ID, deserted.ID}},
			} {
				list, err := tx.UnwatchedPendingBatches(ctx, c.createdBy, 10)
				if err != nil {
					return err
				}
				var got []string
				for _, b := range list {
					got = append(got, b.ID)
				}
				slices.Sort(got)
				slices.Sort(c.want)
				if !slices.Equal(got, c.want) {
					return fmt.Errorf("unwatched pending by %d: %v, want %v", c.createdBy, got, c.want)
				}
			}
			deserted.State = store.BatchRejected
			if err := tx.UpdateBatch(ctx, &deserted); err != nil {
				return err
			}
			list, err := tx.UnwatchedPendingBatches(ctx, tx.At(), 10)
			if err != nil || len(list) != 1 || list[0].ID != direct.ID {
				return fmt.Errorf("after rejecting one: %v %v", list, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		c, err := st.Command(ctx, cmd.ID)
		if err != nil || c.State != "held" || c.TargetAgent != "" {
			t.Fatalf("command held again: %s agent %q %v", c.State, c.TargetAgent, err)
		}
	})
}
