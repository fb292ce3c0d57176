package sim

import (
	"context"
	"slices"
	"testing"

	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestBatchFailures: a batch's nodes whose workflow under it failed (a bulk inspection of a
// machine short of its pool's raised requirements) or was aborted (a rejected batch) are listed,
// each once with its fault; the nodes that got where their verb meant are not.
func TestBatchFailures(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, ids := start(t, st, 3)
		rest(t, h, ids)
		small := SimHardware()
		small.Memory.TotalBytes = 16 << 30
		h.Sim.Machine(ids[1]).SetHardware(small)
		if _, err := h.Metal.UpdatePool(ctx, h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish", HardwareRequirements: []string{"memory>=32GiB"}}); err != nil {
			t.Fatal(err)
		}
		res, err := h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "inspect", Nodes: ids, Reason: "after the DIMM swap"})
		if err != nil {
			t.Fatal(err)
		}
		got := rest(t, h, ids)
		if got[ids[1]].State != "failed" || got[ids[0]].State != "ready" || got[ids[2]].State != "ready" {
			t.Fatalf("after the bulk inspection: %s %s %s", got[ids[0]].State, got[ids[1]].State, got[ids[2]].State)
		}
		fails, err := h.Metal.BatchFailures(ctx, h.Admin, res.Batch.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(fails) != 1 || fails[0].NodeID != ids[1] || fails[0].Name != got[ids[1]].Name || fails[0].State != "failed" ||
			fails[0].FaultCode != string(provision.FaultHardwareMismatch) || fails[0].Error == "" || fails[0].At == 0 {
			t.Fatalf("the bulk inspection's failures: %+v, want %s failed with HARDWARE_MISMATCH", fails, got[ids[1]].Name)
		}
		if b, _, err := h.Metal.Batch(ctx, h.Admin, res.Batch.ID, 1); err != nil || b.Parked != 0 {
			t.Fatalf("the batch after its nodes rest: parked %d, %v", b.Parked, err)
		}

		// Held for approval, then rejected: its nodes' workflows are aborted, and listed so.
		if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
			t.Fatal(err)
		}
		ready := []string{ids[0], ids[2]}
		res, err = h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "deploy", Nodes: ready, Image: "sim-image", Reason: "web tier"})
		if err != nil || !res.Held {
			t.Fatalf("bulk deploy under approval: held %v, %v", res.Held, err)
		}
		if _, err := h.Metal.Reject(ctx, alice, res.Batch.ID, "not this week"); err != nil {
			t.Fatal(err)
		}
		rest(t, h, ready)
		fails, err = h.Metal.BatchFailures(ctx, h.Admin, res.Batch.ID)
		if err != nil {
			t.Fatal(err)
		}
		var nodes []string
		for _, f := range fails {
			if f.State != "aborted" || f.FaultCode != string(provision.FaultBatchRejected) {
				t.Errorf("a rejected batch's node: %+v, want aborted with BATCH_REJECTED", f)
			}
			nodes = append(nodes, f.NodeID)
		}
		slices.Sort(nodes)
		want := slices.Clone(ready)
		slices.Sort(want)
		if !slices.Equal(nodes, want) {
			t.Errorf("the rejected batch's aborted nodes: %v, want %v", nodes, want)
		}
		if _, err := h.Metal.BatchFailures(ctx, h.Admin, "no-such-batch"); err == nil {
			t.Errorf("the failures of a batch that does not exist: no error")
		}
	})
}
