package store_test

import (
	"context"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// Two dumps of the same rows are the same text (tests compare a dump taken before a refused
// request with one taken after it), also after a write that left the rows as they were: on
// PostgreSQL such an UPDATE moves the row.
func TestDumpIsStable(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		before, err := st.Dump(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{
			`UPDATE nodes SET name = name WHERE id = ?`,
			`UPDATE node_macs SET mac = mac WHERE node_id = ?`,
		} {
			if err := st.Write(ctx, func(tx *store.Tx) error {
				_, err := tx.ExecForTests(ctx, q, nodes[0].ID)
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		after, err := st.Dump(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if before != after {
			t.Errorf("the dump changed with the rows unchanged:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
}
