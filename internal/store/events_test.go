package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestEventsSinceNeverSkips: an event whose transaction took a lower id but commits after one
// with a higher id is still delivered to a follower (EventsSince), where following by id would
// pass over it on PostgreSQL; events of a transaction still running wait for its commit; a bad
// cursor is refused.
func TestEventsSinceNeverSkips(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		appendEvent := func(tx *store.Tx, kind string) error {
			return tx.AppendEvent(ctx, store.Event{TenantID: "t", Actor: "test", Kind: kind})
		}
		follow := func(cursor string) ([]string, string) {
			t.Helper()
			evs, next, err := st.EventsSince(ctx, store.EventFilter{Limit: 100}, cursor)
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, e := range evs {
				kinds = append(kinds, e.Kind)
			}
			return kinds, next
		}
		// collect follows from cursor until n events arrived. On PostgreSQL an event waits for
		// every transaction of the cluster older than its own, and other databases of the
		// cluster (other packages' tests) may be running one: it may take a moment.
		collect := func(cursor string, n int) ([]string, string) {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			var all []string
			for {
				got, next := follow(cursor)
				all, cursor = append(all, got...), next
				if len(all) >= n || time.Now().After(deadline) {
					return all, cursor
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		write := func(kind string) {
			t.Helper()
			if err := st.Write(ctx, func(tx *store.Tx) error { return appendEvent(tx, kind) }); err != nil {
				t.Fatal(err)
			}
		}
		write("first")
		got, cursor := collect("", 1)
		if len(got) != 1 || got[0] != "first" {
			t.Fatalf("from the start: %v", got)
		}
		if st.Engine() == store.Postgres {
			// A slow transaction takes an id, another takes the next and commits first.
			slowIn, slowGo, slowDone := make(chan struct{}), make(chan struct{}), make(chan error, 1)
			go func() {
				slowDone <- st.Write(ctx, func(tx *store.Tx) error {
					if err := appendEvent(tx, "slow"); err != nil {
						return err
					}
					close(slowIn)
					<-slowGo
					return nil
				})
			}()
			<-slowIn
			write("fast")
			byID, err := st.Events(ctx, store.EventFilter{Limit: 100})
			if err != nil {
				t.Fatal(err)
			}
			if n := len(byID); n != 2 || byID[1].Kind != "fast" {
				t.Fatalf("by id while the slow one runs: %d events", n)
			}
			// The fast one may wait for the slow one, never the other way round.
			got, cursor = follow(cursor)
			for _, k := range got {
				if k == "slow" {
					t.Fatal("an uncommitted event was delivered")
				}
			}
			close(slowGo)
			if err := <-slowDone; err != nil {
				t.Fatal(err)
			}
			more, next := collect(cursor, 2-len(got))
			all := append(got, more...)
			if len(all) != 2 || all[0] == all[1] {
				t.Fatalf("the follower got %v, want slow and fast once each", all)
			}
			cursor = next
		}
		write("last")
		if got, _ := collect(cursor, 1); len(got) != 1 || got[0] != "last" {
			t.Fatalf("after the cursor: %v", got)
		}
		if _, _, err := st.EventsSince(ctx, store.EventFilter{Limit: 10}, "nonsense"); !errors.Is(err, store.ErrBadCursor) {
			t.Fatalf("bad cursor: %v", err)
		}
	})
}
