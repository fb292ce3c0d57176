package store

import (
	"context"
	"fmt"
	"slices"
	"testing"
)

// A follower gets every event once, in commit order, page after page, also where the
// transactions' ids cross a power of ten (99 then 100): events are ordered by the transaction's
// id as a number, not by its text.
func TestEventsSinceOrdersByTransaction(t *testing.T) {
	ctx := context.Background()
	for engine, s := range openEachEngine(t) {
		t.Run(string(engine), func(t *testing.T) {
			// Four events, the first two of transaction 99 and the last two of transaction 100
			// (PostgreSQL: both long committed).
			var evs []Event
			for i := range 4 {
				evs = append(evs, Event{TenantID: "tn", NodeID: "n", Actor: "test", Kind: fmt.Sprintf("e%d", i)})
			}
			if err := s.Write(ctx, func(tx *Tx) error { return tx.AppendEvents(ctx, evs) }); err != nil {
				t.Fatal(err)
			}
			if engine == Postgres {
				if _, err := s.write.ExecContext(ctx, `UPDATE events SET xid = (CASE WHEN kind IN ('e0', 'e1') THEN '99' ELSE '100' END)::xid8`); err != nil {
					t.Fatal(err)
				}
			}
			for _, limit := range []int{1, 2, 3, 10} {
				t.Run(fmt.Sprintf("pages of %d", limit), func(t *testing.T) {
					var got []string
					cursor := ""
					for range 10 {
						page, next, err := s.EventsSince(ctx, EventFilter{NodeID: "n", Limit: limit}, cursor)
						if err != nil {
							t.Fatal(err)
						}
						for _, e := range page {
							got = append(got, e.Kind)
						}
						if len(page) == 0 {
							break
						}
						cursor = next
					}
					if want := []string{"e0", "e1", "e2", "e3"}; !slices.Equal(got, want) {
						t.Errorf("the follower got %v, want %v", got, want)
					}
				})
			}
		})
	}
}
