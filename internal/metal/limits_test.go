package metal

import (
	"context"
	"math"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// Events after an id past the largest the store holds (int64) are none: before, the id
// wrapped negative in the query and the listing started again from the first event.
func TestEventsAfterAHugeIDAreNone(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		if _, err := f.svc.Enroll(ctx, f.admin, enrollInput("n1")); err != nil {
			t.Fatal(err)
		}
		all, err := f.svc.Events(ctx, f.admin, "", 0, 0)
		if err != nil || len(all) == 0 {
			t.Fatalf("events: %d, %v", len(all), err)
		}
		last := all[len(all)-1].ID
		for _, after := range []uint64{last, math.MaxInt64, math.MaxInt64 + 1, math.MaxUint64} {
			evs, err := f.svc.Events(ctx, f.admin, "", after, 0)
			if err != nil || len(evs) != 0 {
				t.Errorf("events after %d: %d events (first %+v), %v; want none", after, len(evs), evs[:min(1, len(evs))], err)
			}
		}
	})
}
