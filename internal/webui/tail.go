package webui

import (
	"context"
	"math"
	"slices"

	"bcd/internal/store"
)

// eventPage reads up to limit events with ids above after, in id order, as the service's
// Events does for the caller (its tenant, its node).
type eventPage func(ctx context.Context, after uint64, limit int) ([]store.Event, error)

// tailPage is how many events one read of the tail takes at most.
const tailPage = 1000

// lastEvents returns the n newest events fetch sees, newest first, without reading the whole
// log: the service lists events only forwards from an id, so the newest id is found by
// galloping and bisecting with one-event reads (index seeks), then a window of ids before it
// is read, widened until it holds n events or reaches the start. Event ids are unique, so a
// window of w ids holds at most w events.
func lastEvents(ctx context.Context, fetch eventPage, n int) ([]store.Event, error) {
	if n <= 0 {
		return nil, nil
	}
	probe := func(after uint64) (uint64, bool, error) {
		evs, err := fetch(ctx, after, 1)
		if err != nil || len(evs) == 0 {
			return 0, false, err
		}
		return evs[0].ID, true, nil
	}
	lo, ok, err := probe(0)
	if err != nil || !ok {
		return nil, err
	}
	// lo is a visible event's id; none is above hi.
	hi := uint64(math.MaxInt64)
	for step := uint64(1024); ; step *= 2 {
		if step >= hi-lo {
			break
		}
		id, ok, err := probe(lo + step)
		if err != nil {
			return nil, err
		}
		if !ok {
			hi = lo + step
			break
		}
		lo = id
	}
	for lo < hi {
		mid := lo + (hi-lo)/2
		id, ok, err := probe(mid)
		if err != nil {
			return nil, err
		}
		if ok {
			lo = id
		} else {
			hi = mid
		}
	}
	newest := lo
	for w := uint64(n); ; w *= 4 {
		after := uint64(0)
		if w < newest {
			after = newest - w
		}
		got, err := readForward(ctx, fetch, after, n)
		if err != nil {
			return nil, err
		}
		if len(got) >= n || after == 0 {
			slices.Reverse(got)
			return got, nil
		}
	}
}

// readForward reads every event after after and keeps the last n, in id order.
func readForward(ctx context.Context, fetch eventPage, after uint64, n int) ([]store.Event, error) {
	var keep []store.Event
	for {
		evs, err := fetch(ctx, after, tailPage)
		if err != nil {
			return nil, err
		}
		keep = append(keep, evs...)
		if len(keep) > n {
			keep = slices.Clone(keep[len(keep)-n:])
		}
		if len(evs) < tailPage {
			return keep, nil
		}
		after = evs[len(evs)-1].ID
	}
}
