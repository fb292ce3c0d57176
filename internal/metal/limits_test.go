package metal

import (
	"context"
	"fmt"
	"math"
	"strings"
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

// An event listing's kinds and its newest are checked before the store is asked: too many
// kinds, a malformed one, before_id without newest are refused, saying what is accepted; an
// id beyond int64 lists nothing, or with newest everything before it.
func TestEventQueryBounds(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		f := newFixture(t, st)
		ctx := context.Background()
		if _, err := f.svc.Enroll(ctx, f.admin, enrollInput("b1")); err != nil {
			t.Fatal(err)
		}
		kinds := make([]string, MaxEventKinds+1)
		for i := range kinds {
			kinds[i] = fmt.Sprintf("k%d.x", i)
		}
		for _, c := range []struct {
			q    EventQuery
			want string
		}{
			{EventQuery{Kinds: kinds}, "accepted are at most 16"},
			{EventQuery{Kinds: []string{"node.enroll", "node enroll"}}, `"node enroll" is not an event kind`},
			{EventQuery{BeforeID: 3}, "before_id: is for the newest events"},
			{EventQuery{Newest: true, Limit: -1}, "accepted are 1-"},
		} {
			if _, err := f.svc.ListEvents(ctx, f.admin, c.q); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%+v: %v, want an error saying %q", c.q, err, c.want)
			}
		}
		newest, err := f.svc.ListEvents(ctx, f.admin, EventQuery{Newest: true, BeforeID: math.MaxUint64, Kinds: []string{"node.*"}})
		if err != nil || len(newest) != 1 || newest[0].Kind != "node.enroll" {
			t.Errorf("the newest node.* events before the largest id: %+v, %v: want the enrolment", newest, err)
		}
	})
}
