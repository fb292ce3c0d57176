package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestNodeUserDataRoundTrip: a node's user-data columns (migration 00044) round-trip through
// every node read; UpdateNode leaves them alone; SetNodeUserData replaces them, deleting the
// secret the old reference named (and only that one); SiteUserData lists the site's nodes that
// have some; clearing and deleting the node delete the secret.
func TestNodeUserDataRoundTrip(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		n0 := nodes[0]
		write := func(f func(tx *store.Tx) error) {
			t.Helper()
			if err := st.Write(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
		secret := func(id string) bool {
			_, err := st.Sealed(ctx, id)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				t.Fatal(err)
			}
			return err == nil
		}
		write(func(tx *store.Tx) error {
			for _, id := range []string{"ud1", "ud2"} {
				if err := tx.InsertSecret(ctx, id, n0.TenantID, []byte("sealed "+id)); err != nil {
					return err
				}
			}
			return nil
		})
		set := func(u store.UserData) store.Node {
			t.Helper()
			var out store.Node
			write(func(tx *store.Tx) error {
				n, err := tx.LockNode(ctx, n0.ID, "")
				if err != nil {
					return err
				}
				if err := tx.SetNodeUserData(ctx, &n, u); err != nil {
					return err
				}
				out = n
				return nil
			})
			return out
		}
		first := store.UserData{Ref: "secret://ud1", SHA256: strings.Repeat("a", 64), Size: 123}
		n := set(first)
		got, err := st.Node(ctx, n0.ID, "")
		if err != nil {
			t.Fatal(err)
		}
		if got.UserDataRef != first.Ref || got.UserDataSHA256 != first.SHA256 || got.UserDataSize != first.Size || got.Version != n.Version || n.Version != n0.Version+1 {
			t.Fatalf("read back %q %q %d v%d; want %+v at v%d", got.UserDataRef, got.UserDataSHA256, got.UserDataSize, got.Version, first, n0.Version+1)
		}
		list, err := st.Nodes(ctx, store.NodeFilter{Limit: 10})
		if err != nil || len(list) != len(nodes) || list[0].UserDataRef != first.Ref || list[1].UserDataRef != "" {
			t.Fatalf("listed: %v %+v", err, list)
		}
		// UpdateNode (every engine write) neither reads nor writes the columns.
		write(func(tx *store.Tx) error {
			n, err := tx.LockNode(ctx, n0.ID, "")
			if err != nil {
				return err
			}
			n.UserDataRef, n.State = "secret://other", "inspecting"
			return tx.UpdateNode(ctx, &n)
		})
		if got, _ := st.Node(ctx, n0.ID, ""); got.UserDataRef != first.Ref || got.State != "inspecting" {
			t.Fatalf("after UpdateNode: ref %q state %s", got.UserDataRef, got.State)
		}
		write(func(tx *store.Tx) error {
			m, err := tx.SiteUserData(ctx, n0.SiteID)
			if err != nil {
				return err
			}
			if len(m) != 1 || m[n0.ID] != first {
				t.Errorf("site user-data %+v, want only %s: %+v", m, n0.ID, first)
			}
			return nil
		})

		second := store.UserData{Ref: "secret://ud2", SHA256: strings.Repeat("b", 64), Size: 7}
		set(second)
		if secret("ud1") || !secret("ud2") {
			t.Fatalf("after the replacement: ud1 kept %t, ud2 kept %t; want only ud2", secret("ud1"), secret("ud2"))
		}
		if got := set(store.UserData{}); got.UserDataRef != "" || got.UserDataSize != 0 || secret("ud2") {
			t.Fatalf("after clearing: %q %d, secret kept %t", got.UserDataRef, got.UserDataSize, secret("ud2"))
		}

		// Deleting a node deletes its user-data's secret.
		write(func(tx *store.Tx) error { return tx.InsertSecret(ctx, "ud3", n0.TenantID, []byte("sealed ud3")) })
		n = set(store.UserData{Ref: "secret://ud3", SHA256: strings.Repeat("c", 64), Size: 1})
		write(func(tx *store.Tx) error {
			n, err := tx.LockNode(ctx, n0.ID, "")
			if err != nil {
				return err
			}
			return tx.DeleteNode(ctx, n)
		})
		if secret("ud3") {
			t.Fatal("deleting the node kept its user-data's secret")
		}
	})
}
