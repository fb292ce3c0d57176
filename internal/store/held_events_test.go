package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// SQLite's writer holds the events a write appends and inserts a group's events together before
// its commit, a few statements of many rows: in the order appended, with the write's time; what
// a rolled-back savepoint or a failed write appended is not inserted; every write's events are
// there once the writes return.
func TestWriterInsertsHeldEventsAtTheCommit(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		ev := func(kind string) store.Event { return store.Event{TenantID: "t", Actor: "test", Kind: kind} }
		errNo := errors.New("no")
		if err := st.Write(ctx, func(tx *store.Tx) error {
			if err := tx.AppendEvent(ctx, ev("a")); err != nil {
				return err
			}
			if err := tx.Savepoint(ctx, func() error {
				if err := tx.AppendEvent(ctx, ev("rolled back")); err != nil {
					return err
				}
				return errNo
			}); !errors.Is(err, errNo) {
				return fmt.Errorf("the savepoint: %v", err)
			}
			return tx.AppendEvents(ctx, []store.Event{ev("b"), ev("c")})
		}); err != nil {
			t.Fatal(err)
		}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			if err := tx.AppendEvent(ctx, ev("failed write")); err != nil {
				return err
			}
			return errNo
		}); !errors.Is(err, errNo) {
			t.Fatalf("the failing write: %v", err)
		}
		// Many writes at once, grouped as they come; each appends 0 to 69 events (the largest
		// chunk and its remainders).
		var wg sync.WaitGroup
		for w := range 24 {
			wg.Go(func() {
				evs := make([]store.Event, w*3)
				for i := range evs {
					evs[i] = ev(fmt.Sprintf("w%02d-%03d", w, i))
				}
				if err := st.Write(ctx, func(tx *store.Tx) error { return tx.AppendEvents(ctx, evs) }); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		got, err := st.Events(ctx, store.EventFilter{TenantID: "t", Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(got, func(a, b store.Event) int { return int(a.ID) - int(b.ID) })
		var first []string
		perWrite := map[string][]string{}
		for _, e := range got {
			if len(e.Kind) == 7 && e.Kind[0] == 'w' {
				perWrite[e.Kind[:3]] = append(perWrite[e.Kind[:3]], e.Kind)
				continue
			}
			first = append(first, e.Kind)
			if e.At == 0 || e.Data != "{}" {
				t.Errorf("event %s: at %d, data %q; want the write's time and {}", e.Kind, e.At, e.Data)
			}
		}
		if !slices.Equal(first, []string{"a", "b", "c"}) {
			t.Errorf("the first writes' events, by id: %v; want [a b c]", first)
		}
		for w := range 24 {
			key := fmt.Sprintf("w%02d", w)
			want := make([]string, w*3)
			for i := range want {
				want[i] = fmt.Sprintf("w%02d-%03d", w, i)
			}
			if !slices.Equal(perWrite[key], want) && !(len(want) == 0 && perWrite[key] == nil) {
				t.Errorf("write %d's events, by id: %v; want %v", w, perWrite[key], want)
			}
		}
	})
}

// Every column of a held event reaches its row as appended (SQLite's writer binds them without
// database/sql's arguments): texts of any length and content, empty ones as empty (not NULL),
// an empty data as {}, across statements of several sizes (67 events: 64, 2 and 1 rows).
func TestWriterInsertsHeldEventsWhole(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		want := make([]store.Event, 67)
		for i := range want {
			want[i] = store.Event{TenantID: "tenant-é", NodeID: fmt.Sprintf("node-%d", i%5), Actor: "test",
				Kind: fmt.Sprintf("k%03d", i), FromState: "", ToState: "ready", Reason: fmt.Sprintf("%*s", i*37, "«r»"),
				Data: fmt.Sprintf(`{"i":%d}`, i)}
			if i%4 == 0 {
				want[i].Data, want[i].FromState = "", "enrolling"
			}
		}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.AppendEvents(ctx, want) }); err != nil {
			t.Fatal(err)
		}
		got, err := st.Events(ctx, store.EventFilter{TenantID: "tenant-é", Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(got, func(a, b store.Event) int { return int(a.ID) - int(b.ID) })
		if len(got) != len(want) {
			t.Fatalf("%d events, want %d", len(got), len(want))
		}
		for i, g := range got {
			w := want[i]
			if w.Data == "" {
				w.Data = "{}"
			}
			w.ID, w.At = g.ID, g.At
			if g != w || g.At == 0 {
				t.Errorf("event %d:\n got %+v\nwant %+v", i, g, w)
			}
		}
	})
}
