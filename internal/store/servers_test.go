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
		write(func(tx *store.Tx) error { return tx.ServerAlive(ctx, "dead") })
		connect("a-dead", "dead")
		connect("a-left", "dead")
		connect("a-unknown", "")
		at(5_000)
		write(func(tx *store.Tx) error { return tx.ServerAlive(ctx, "live") })
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
