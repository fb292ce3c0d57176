package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A node's identity generation, as the gateway admits certificates by it: the node's own,
// the new one once bumped, and not found for an id no node has, even when a node is named so.
func TestNodeGeneration(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		pool, _ := seed(t, st)
		n := store.Node{ID: store.NewID(time.Now()), TenantID: pool.TenantID, SiteID: pool.SiteID, PoolID: pool.ID,
			Name: "g0", State: "ready", HardwareProfile: "redfish", IdentityGeneration: 3}
		// A node named as an id that no node has: the generation is looked up by id only.
		named := store.Node{ID: store.NewID(time.Now()), TenantID: pool.TenantID, SiteID: pool.SiteID, PoolID: pool.ID,
			Name: "019b0000-0000-7000-8000-000000000000", State: "ready", HardwareProfile: "redfish"}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			if err := tx.InsertNode(ctx, &n); err != nil {
				return err
			}
			return tx.InsertNode(ctx, &named)
		}); err != nil {
			t.Fatal(err)
		}
		if gen, err := st.NodeGeneration(ctx, n.ID); err != nil || gen != 3 {
			t.Fatalf("generation %d, %v; want 3", gen, err)
		}
		n.IdentityGeneration = 4
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.UpdateNode(ctx, &n) }); err != nil {
			t.Fatal(err)
		}
		if gen, err := st.NodeGeneration(ctx, n.ID); err != nil || gen != 4 {
			t.Fatalf("after the bump: generation %d, %v; want 4", gen, err)
		}
		if _, err := st.NodeGeneration(ctx, named.Name); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("an id no node has: %v, want not found", err)
		}
	})
}
