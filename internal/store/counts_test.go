package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestCountStranded: the stranded nodes are counted exactly, per tenant and over all, with the
// same rule StrandedNodes lists them by: a node with a wake-up row, an open workflow, no target,
// maintenance on or failed is not stranded. Another tenant's 1,100 stranded nodes, listed first,
// do not hide one tenant's (the web UI counted from a list of at most 1,000 before).
func TestCountStranded(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		pool, seeded := seed(t, st) // 3 enrolling nodes of tenant t, target ready: stranded
		var other string
		err := st.Write(ctx, func(tx *store.Tx) error {
			tn, err := tx.InsertTenant(ctx, "o")
			if err != nil {
				return err
			}
			other = tn.ID
			for i := range 1100 {
				// Ids before the seed's: a list in id order meets these first.
				n := store.Node{ID: fmt.Sprintf("00000000-0000-7000-8000-%012d", i), TenantID: tn.ID, SiteID: pool.SiteID, PoolID: pool.ID,
					Name: fmt.Sprintf("o%d", i), State: "deploying", TargetState: "deployed", HardwareProfile: "redfish"}
				if err := tx.InsertNode(ctx, &n); err != nil {
					return err
				}
			}
			// Not stranded: in maintenance, failed, or resting with no target.
			for i, mod := range []func(*store.Node){
				func(n *store.Node) { n.Maintenance = true },
				func(n *store.Node) { n.State = "failed" },
				func(n *store.Node) { n.State, n.TargetState = "ready", "" },
			} {
				n := store.Node{ID: store.NewID(time.Now()), TenantID: pool.TenantID, SiteID: pool.SiteID, PoolID: pool.ID,
					Name: fmt.Sprintf("x%d", i), State: "enrolling", TargetState: "ready", HardwareProfile: "redfish"}
				mod(&n)
				if err := tx.InsertNode(ctx, &n); err != nil {
					return err
				}
			}
			// One of the seed's gets a wake-up row: no longer stranded.
			return tx.Wake(ctx, seeded[0].ID, "test", 0)
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			tenant string
			want   int
		}{{pool.TenantID, 2}, {other, 1100}, {"", 1102}, {"no-such-tenant", 0}} {
			if got, err := st.CountStranded(ctx, tc.tenant); err != nil || got != tc.want {
				t.Errorf("tenant %q: %d stranded (%v), want %d", tc.tenant, got, err, tc.want)
			}
		}
		listed, err := st.StrandedNodes(ctx, 2000)
		if err != nil || len(listed) != 1102 {
			t.Fatalf("StrandedNodes: %d (%v), want 1102", len(listed), err)
		}
	})
}
