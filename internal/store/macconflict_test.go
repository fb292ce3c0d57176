package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// Binding a MAC that belongs to another node is a conflict the caller goes on from in the same
// transaction (the engine then fails the step with MAC_CONFLICT): what it writes next commits,
// on PostgreSQL as on SQLite, and the MAC stays its owner's.
func TestAddNodeMACConflictLeavesTheTransactionUsable(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		owner, other := nodes[0], nodes[1]
		cases := []struct {
			name    string
			mac     string
			want    error
			wantMAC []string
		}{
			{"another node's MAC", owner.MACs[0], store.ErrConflict, other.MACs},
			{"its own MAC", other.MACs[0], nil, other.MACs},
			{"a new MAC", "52:54:00:00:01:01", nil, append(slices.Clone(other.MACs), "52:54:00:00:01:01")},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				err := st.Write(ctx, func(tx *store.Tx) error {
					n, err := tx.LockNode(ctx, other.ID, "")
					if err != nil {
						return err
					}
					if err := tx.AddNodeMAC(ctx, &n, c.mac); !errors.Is(err, c.want) {
						t.Errorf("binding %s: %v, want %v", c.mac, err, c.want)
					}
					// The caller goes on in the transaction.
					n.FaultCode = "after " + c.name
					return tx.UpdateNode(ctx, &n)
				})
				if err != nil {
					t.Fatalf("the transaction after binding %s: %v", c.mac, err)
				}
				n, err := st.Node(ctx, other.ID, "")
				if err != nil {
					t.Fatal(err)
				}
				if n.FaultCode != "after "+c.name || !slices.Equal(n.MACs, c.wantMAC) {
					t.Errorf("node after binding %s: fault %q, MACs %v; want %q, %v", c.mac, n.FaultCode, n.MACs, "after "+c.name, c.wantMAC)
				}
				o, err := st.Node(ctx, owner.ID, "")
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(o.MACs, owner.MACs) {
					t.Errorf("the owner's MACs %v, want %v", o.MACs, owner.MACs)
				}
			})
		}
	})
}
