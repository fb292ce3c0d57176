package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestEventKindPattern: kinds and prefixes are accepted, anything else is refused saying what
// a kind is.
func TestEventKindPattern(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{"node.fail", true}, {"node.*", true}, {"node.hardware.*", true}, {"workflow.step", true},
		{"control_plane.restore_fenced", true}, {"node", true}, {"token2.create", true},
		{"", false}, {".*", false}, {"*", false}, {"node.", false}, {".node", false}, {"node..fail", false},
		{"Node.fail", false}, {"node.f*", false}, {"node.*.fail", false}, {"node fail", false}, {"node.fail;", false}, {"nöde.fail", false},
	} {
		err := store.EventKindPattern(c.in)
		if (err == nil) != c.ok {
			t.Errorf("EventKindPattern(%q) = %v, want ok %v", c.in, err, c.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "node.fail") {
			t.Errorf("EventKindPattern(%q): %v: want an example of what is accepted", c.in, err)
		}
	}
}

// TestEventsByKindAndNewest: listings by kind (exact and prefix) read the log in windows and
// answer what a filter of every event answers; the newest events come oldest first; a
// follower of rare kinds gets each of them once and, once caught up, is not answered the same
// stretch again; a follower may start at the newest events.
func TestEventsByKindAndNewest(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		st.SetEventScanWindowForTests(16) // many windows over a few hundred events
		var evs []store.Event
		for i := range 300 {
			e := store.Event{TenantID: "t", NodeID: fmt.Sprintf("n%d", i%7), Actor: "test", Kind: "workflow.step"}
			switch {
			case i == 3:
				e.Kind = "batch.create" // once, early: a listing of it reads every window after it
			case i%37 == 0:
				e.Kind = "node.fail"
			case i%50 == 1:
				e.Kind = "node.hardware.changed"
			case i%60 == 2:
				e.Kind = "nodes.counted" // not under node.*
			case i%90 == 5:
				e.Kind, e.TenantID = "node.fail", "u"
			}
			evs = append(evs, e)
		}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.AppendEvents(ctx, evs) }); err != nil {
			t.Fatal(err)
		}
		all, err := st.Events(ctx, store.EventFilter{Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		matches := func(f store.EventFilter, e store.Event) bool {
			if f.NodeID != "" && e.NodeID != f.NodeID || f.TenantID != "" && e.TenantID != f.TenantID {
				return false
			}
			if len(f.Kinds) == 0 {
				return true
			}
			for _, k := range f.Kinds {
				if p, ok := strings.CutSuffix(k, "*"); ok && strings.HasPrefix(e.Kind, p) || e.Kind == k {
					return true
				}
			}
			return false
		}
		// want is what f selects of every event, by reading them all.
		want := func(f store.EventFilter) []uint64 {
			var out []uint64
			for _, e := range all {
				if matches(f, e) && (f.Newest && (f.BeforeID == 0 || e.ID < f.BeforeID) || !f.Newest && e.ID > f.AfterID) {
					out = append(out, e.ID)
				}
			}
			if len(out) > f.Limit {
				if f.Newest {
					return out[len(out)-f.Limit:]
				}
				return out[:f.Limit]
			}
			return out
		}
		ids := func(evs []store.Event) []uint64 {
			out := make([]uint64, len(evs))
			for i, e := range evs {
				out[i] = e.ID
			}
			return out
		}
		mid := all[len(all)/2].ID
		for _, f := range []store.EventFilter{
			{Kinds: []string{"node.fail"}, Limit: 5},
			{Kinds: []string{"node.fail"}, Limit: 1000},
			{Kinds: []string{"node.*"}, Limit: 1000},
			{Kinds: []string{"node.hardware.*", "batch.create"}, Limit: 1000},
			{Kinds: []string{"batch.create"}, Limit: 10},
			{Kinds: []string{"batch.create"}, AfterID: mid, Limit: 10},
			{Kinds: []string{"node.fail"}, AfterID: mid, Limit: 3},
			{Kinds: []string{"node.fail"}, TenantID: "u", Limit: 100},
			{Kinds: []string{"node.fail", "node.hardware.changed"}, NodeID: "n2", Limit: 100},
			{Kinds: []string{"no.such"}, Limit: 100},
			{TenantID: "u", Limit: 100}, // a tenant's few events among many: windows too
			{TenantID: "u", AfterID: mid, Limit: 1},
			{Newest: true, TenantID: "u", Limit: 2},
			{Newest: true, Limit: 3},
			{Newest: true, Limit: 1000},
			{Newest: true, Kinds: []string{"node.fail"}, Limit: 4},
			{Newest: true, Kinds: []string{"batch.create"}, Limit: 4},
			{Newest: true, Kinds: []string{"node.*"}, BeforeID: mid, Limit: 3},
			{Newest: true, NodeID: "n3", Limit: 5},
			{Newest: true, NodeID: "n3", Kinds: []string{"node.fail"}, TenantID: "t", Limit: 5},
			{Newest: true, BeforeID: all[0].ID, Limit: 5},
		} {
			got, err := st.Events(ctx, f)
			if err != nil {
				t.Fatalf("%+v: %v", f, err)
			}
			if w := want(f); !slices.Equal(ids(got), w) {
				t.Errorf("%+v: got ids %v, want %v", f, ids(got), w)
			}
		}

		// since polls EventsSince from cursor until it answers n events in all, each call at
		// most limit (on PostgreSQL an event waits for every older transaction of the cluster).
		since := func(f store.EventFilter, cursor string, n int) ([]uint64, string) {
			t.Helper()
			var got []uint64
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				evs, next, err := st.EventsSince(ctx, f, cursor)
				if err != nil {
					t.Fatal(err)
				}
				if len(evs) > f.Limit {
					t.Fatalf("%d events for a limit of %d", len(evs), f.Limit)
				}
				got, cursor = append(got, ids(evs)...), next
				if len(got) >= n || time.Now().After(deadline) {
					return got, cursor
				}
			}
		}
		fails := store.EventFilter{Kinds: []string{"node.fail"}, Limit: 2}
		wantFails := want(store.EventFilter{Kinds: fails.Kinds, Limit: 1000})
		got, cursor := since(fails, "", len(wantFails))
		if !slices.Equal(got, wantFails) {
			t.Fatalf("following node.fail from the start: %v, want %v", got, wantFails)
		}
		// Caught up: nothing more, the cursor moved past the events after the last failure, and
		// then stays where it is (it covers the whole log).
		evs, next, err := st.EventsSince(ctx, fails, cursor)
		if err != nil || len(evs) != 0 || next == cursor {
			t.Fatalf("after the last failure: %d events, cursor %q → %q, %v: want none and the cursor past the rest of the log", len(evs), cursor, next, err)
		}
		cursor = next
		if evs, next, err := st.EventsSince(ctx, fails, cursor); err != nil || len(evs) != 0 || next != cursor {
			t.Fatalf("caught up: %d events, cursor %q → %q, %v: want none and the same cursor", len(evs), cursor, next, err)
		}
		// Newer events: the follower gets the new failure alone.
		more := []store.Event{{TenantID: "t", NodeID: "n1", Actor: "test", Kind: "workflow.step"}, {TenantID: "t", NodeID: "n1", Actor: "test", Kind: "node.fail", Reason: "new"}}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.AppendEvents(ctx, more) }); err != nil {
			t.Fatal(err)
		}
		got, _ = since(fails, cursor, 1)
		if len(got) != 1 || got[0] <= wantFails[len(wantFails)-1] {
			t.Fatalf("after the new failure: %v, want one event after %d", got, wantFails[len(wantFails)-1])
		}
		newFail := got[0]
		// A follower starting at the newest: the last two failures, then only what comes.
		newest := store.EventFilter{Kinds: []string{"node.fail"}, Limit: 2, Newest: true}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if evs, cursor, err = st.EventsSince(ctx, newest, ""); err != nil {
				t.Fatal(err)
			}
			if len(evs) == 2 && evs[1].ID == newFail || time.Now().After(deadline) {
				break
			}
		}
		if w := []uint64{wantFails[len(wantFails)-1], newFail}; !slices.Equal(ids(evs), w) {
			t.Fatalf("the newest failures: %v, want %v", ids(evs), w)
		}
		if evs, _, err := st.EventsSince(ctx, newest, cursor); err != nil || len(evs) != 0 {
			t.Fatalf("following from the newest: %v, %v: want nothing new", ids(evs), err)
		}
	})
}
