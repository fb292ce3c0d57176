package engine

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// A node join token handed out in a claim is remembered (by its hash) until a join uses it, so
// the join signs the node's certificate before the writer without reading the token's row
// beside it. The writer still decides: a token whose node's identity moved on since is refused
// though remembered. A claim run again (its writes undone) leaves only the token it handed out.
func TestJoinTokenHandedOutIsRemembered(t *testing.T) {
	for _, tc := range []struct {
		name     string
		rehearse bool // every group of writes run twice (SQLite)
		revoke   bool // the node's identity generation moves on between claim and join
	}{
		{name: "join"},
		{name: "claim run twice", rehearse: true},
		{name: "identity revoked meanwhile", revoke: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			st := storetest.Open(t, store.SQLite)
			f := newWFFixture(t, st, "inspecting", "ready", []workflow.Step{{Use: "boot.prepareRamdisk", Timeout: time.Hour}}, nil, Config{})
			f.checkAttestations(t, time.Now())
			f.run(t)
			st.RehearseWrites(tc.rehearse)
			cmds, err := f.e.Claim(ctx, f.site, 10)
			st.RehearseWrites(false)
			if err != nil || len(cmds) != 1 || cmds[0].Kind != "boot.prepareRamdisk" {
				t.Fatalf("claimed %+v, %v; want the workflow's boot.prepareRamdisk", cmds, err)
			}
			var args struct{ Token string }
			if err := json.Unmarshal([]byte(cmds[0].Args), &args); err != nil || args.Token == "" {
				t.Fatalf("the claimed command carries no token: %s", cmds[0].Args)
			}
			hash := string(pki.HashToken(args.Token))
			if got, ok := f.e.joinTokens.Get(hash); !ok || got.node != f.node.ID || got.gen != f.node.IdentityGeneration {
				t.Fatalf("the token handed out is remembered as %+v (%v), want node %s generation %d", got, ok, f.node.ID, f.node.IdentityGeneration)
			}
			if n := f.e.joinTokens.Len(); n != 1 {
				t.Errorf("%d tokens remembered, want 1 (the one handed out)", n)
			}
			if tc.revoke {
				if err := st.Write(ctx, func(tx *store.Tx) error {
					n, err := tx.LockNode(ctx, f.node.ID, "")
					if err != nil {
						return err
					}
					n.IdentityGeneration++
					return tx.UpdateNode(ctx, &n)
				}); err != nil {
					t.Fatal(err)
				}
			}
			_, csr, err := pki.NewKeyAndCSR("ramdisk")
			if err != nil {
				t.Fatal(err)
			}
			der, nodeID, gen, err := f.e.JoinNode(ctx, args.Token, csr, "node")
			if tc.revoke {
				if !errors.Is(err, store.ErrTokenInvalid) || der != nil {
					t.Fatalf("join with a token of a revoked generation: %v (certificate %v), want ErrTokenInvalid", err, der != nil)
				}
			} else if err != nil || nodeID != f.node.ID || gen != f.node.IdentityGeneration || len(der) == 0 {
				t.Fatalf("join: node %s generation %d, %v; want %s %d", nodeID, gen, err, f.node.ID, f.node.IdentityGeneration)
			}
			if _, ok := f.e.joinTokens.Get(hash); ok {
				t.Error("the token is still remembered after its join")
			}
		})
	}
}
