package store_test

import (
	"context"
	"slices"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// WakeMany takes a list naming a node more than once, on both engines (PostgreSQL refuses an
// upsert that updates one row twice), within one statement's chunk and across chunks.
func TestWakeManyTakesDuplicates(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		a, b := nodes[0].ID, nodes[1].ID
		many := make([]string, 0, 450)
		for len(many) < 450 {
			many = append(many, a, b)
		}
		cases := []struct {
			name string
			ids  []string
		}{
			{"twice in a row", []string{a, a}},
			{"apart", []string{a, b, a}},
			{"in several chunks", many},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				if err := st.Write(ctx, func(tx *store.Tx) error { return tx.WakeMany(ctx, c.ids, "test") }); err != nil {
					t.Fatalf("waking %d nodes: %v", len(c.ids), err)
				}
				wus, err := st.WakeUps(ctx, 10)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, w := range wus {
					got = append(got, w.NodeID)
				}
				for _, id := range c.ids {
					if !slices.Contains(got, id) {
						t.Errorf("node %s not woken: %v", id, got)
					}
				}
			})
		}
	})
}
