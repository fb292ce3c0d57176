package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestDeadServersConnections: the connections of a server silent since before the cut-off end
// (counted as departed at its last heartbeat), those of live servers, of the caller and of
// unknown servers do not; a dead server holding no connection is forgotten; a connection ended
// so is recorded again by its server, one its agent left after that is not.
func TestDeadServersConnections(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		var mu sync.Mutex
		now := time.UnixMicro(1_000_000_000)
		st.SetClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
		at := func(us int64) {
			mu.Lock()
			now = time.UnixMicro(us)
			mu.Unlock()
		}
		write := func(f func(tx *store.Tx) error) {
			t.Helper()
			if err := st.Write(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
		connect := func(id, server string) {
			write(func(tx *store.Tx) error {
				return tx.UpsertAgent(ctx, store.Agent{ID: id, Kind: "site", SiteID: "s", ConnID: id + "-c", ServerID: server})
			})
		}
		at(1_000)
		write(func(tx *store.Tx) error { return tx.ServerAlive(ctx, "dead", 0) })
		connect("a-dead", "dead")
		connect("a-left", "dead")
		connect("a-unknown", "")
		at(5_000)
		write(func(tx *store.Tx) error { return tx.ServerAlive(ctx, "live", 0) })
		connect("a-live", "live")
		connect("a-self", "self")
		write(func(tx *store.Tx) error { return tx.AgentGone(ctx, "a-left", "a-left-c") })
		var ended int
		write(func(tx *store.Tx) error {
			var err error
			ended, err = tx.EndDeadServersConnections(ctx, "self", 2_000)
			return err
		})
		as, err := st.SiteAgents(ctx)
		if err != nil {
			t.Fatal(err)
		}
		state := map[string]store.Agent{}
		for _, a := range as {
			state[a.ID] = a
		}
		if ended != 1 || state["a-dead"].Connected || state["a-dead"].LastSeen != 1_000 {
			t.Fatalf("ended %d; the dead server's agent: %+v (want ended, departed at 1000)", ended, state["a-dead"])
		}
		for _, id := range []string{"a-live", "a-self", "a-unknown"} {
			if !state[id].Connected {
				t.Errorf("%s was ended", id)
			}
		}
		// Forgotten: a second pass ends nothing, and the dead server's row is gone (a heartbeat
		// now starts it anew).
		write(func(tx *store.Tx) error {
			var err error
			ended, err = tx.EndDeadServersConnections(ctx, "self", 2_000)
			return err
		})
		if ended != 0 {
			t.Fatalf("a second pass ended %d", ended)
		}
		// The dead server was only cut off: it records its live connections again, as of its
		// last heartbeat; the agent that left it stays departed.
		at(9_000)
		write(func(tx *store.Tx) error {
			for _, id := range []string{"a-dead", "a-left"} {
				if err := tx.ReassertConnection(ctx, id, id+"-c", "dead", 1_000); err != nil {
					return err
				}
			}
			return nil
		})
		as, _ = st.SiteAgents(ctx)
		for _, a := range as {
			if want := a.ID != "a-left"; a.Connected != want {
				t.Errorf("%s connected %v, want %v", a.ID, a.Connected, want)
			}
		}
	})
}

// TestSyncClock: on PostgreSQL the store's time is the database's — a local clock an hour off
// is corrected by SyncClock, and a clock a test sets by hand is left alone; on SQLite (one
// process, the store's only clock) the local clock is the store's.
func TestSyncClock(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		at := func() time.Time {
			t.Helper()
			var us int64
			if err := st.Write(ctx, func(tx *store.Tx) error { us = tx.At(); return nil }); err != nil {
				t.Fatal(err)
			}
			return time.UnixMicro(us)
		}
		near := func(got, want time.Time) bool { return got.Sub(want).Abs() < 2*time.Second }
		st.SetLocalClock(func() time.Time { return time.Now().Add(time.Hour) })
		if got := at(); !near(got, time.Now().Add(time.Hour)) {
			t.Fatalf("before syncing, the store's time is %s, want the local clock's", got)
		}
		off, err := st.SyncClock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Engine() == store.SQLite {
			if off != 0 || !near(at(), time.Now().Add(time.Hour)) {
				t.Fatalf("SQLite: offset %s, time %s; want the local clock's", off, at())
			}
		} else if !near(time.Now().Add(-off), time.Now().Add(time.Hour)) || !near(at(), time.Now()) {
			t.Fatalf("PostgreSQL: offset %s, time %s; want the database's (now)", off, at())
		}
		// A clock off by less than a second is trusted (a reading is only as good as half
		// its round trip; NTP does better).
		st.SetLocalClock(func() time.Time { return time.Now().Add(300 * time.Millisecond) })
		if off, err := st.SyncClock(ctx); err != nil || off != 0 {
			t.Fatalf("a clock 300 ms off: offset %s (%v), want 0", off, err)
		}
		fixed := time.UnixMicro(1_000_000_000)
		st.SetClock(func() time.Time { return fixed })
		if off, err := st.SyncClock(ctx); err != nil || off != 0 || !at().Equal(fixed) {
			t.Fatalf("a clock set by hand: offset %s (%v), time %s; want it as set", off, err, at())
		}
	})
}
