package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// The reaper applies a departure only to an agent still as AgentsGoneSince listed it
// (Tx.StillGoneSince): disconnected before the grace period's start and not dealt with yet. An
// agent back on a new connection, gone again more recently, already reaped, or never seen is
// not; AgentsGoneSince lists by id, the order in which reapers lock them.
func TestStillGoneSince(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
		write := clockedWrites(t, st, &now)
		connect := func(id, conn string) {
			write(func(tx *store.Tx) error { return tx.UpsertAgent(ctx, store.Agent{ID: id, Kind: "node", ConnID: conn}) })
		}
		leave := func(id, conn string) { write(func(tx *store.Tx) error { return tx.AgentGone(ctx, id, conn) }) }
		// At now: each agent as the reaper lists it, 20 s into the past.
		for _, id := range []string{"node:gone", "node:back", "node:left-again", "node:reaped", "node:connected"} {
			connect(id, "c1")
			if id != "node:connected" {
				leave(id, "c1")
			}
		}
		write(func(tx *store.Tx) error { return tx.MarkAgentReaped(ctx, "node:reaped") })
		now = now.Add(20 * time.Second)
		before := now.Add(-15 * time.Second).UnixMicro()
		var listed []string
		write(func(tx *store.Tx) error {
			var err error
			listed, err = tx.AgentsGoneSince(ctx, before)
			return err
		})
		if want := []string{"node:back", "node:gone", "node:left-again"}; !slices.Equal(listed, want) {
			t.Fatalf("listed %v, want %v", listed, want)
		}
		// Then, before the departures are applied:
		connect("node:back", "c2")
		connect("node:left-again", "c2")
		leave("node:left-again", "c2")
		for _, tc := range []struct {
			id   string
			want bool
		}{
			{"node:gone", true},
			{"node:back", false},       // a new connection since the list
			{"node:left-again", false}, // gone again, within the grace period
			{"node:reaped", false},     // dealt with
			{"node:connected", false},
			{"node:never", false},
		} {
			var got bool
			write(func(tx *store.Tx) error {
				var err error
				got, err = tx.StillGoneSince(ctx, tc.id, before)
				return err
			})
			if got != tc.want {
				t.Errorf("%s still gone: %v, want %v", tc.id, got, tc.want)
			}
		}
	})
}

// A departed agent dealt with by the reaper keeps when it was last seen (what an operator reads
// in the site agents' list); back on a new connection and gone again, it is the reaper's again.
func TestReapedAgentKeepsItsLastSeen(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		now := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
		write := clockedWrites(t, st, &now)
		const id = "site-agent-1"
		connect := func(conn string) {
			write(func(tx *store.Tx) error {
				return tx.UpsertAgent(ctx, store.Agent{ID: id, Kind: "site", SiteID: "s", ConnID: conn})
			})
		}
		gone := func() []string {
			t.Helper()
			var listed []string
			write(func(tx *store.Tx) error {
				var err error
				listed, err = tx.AgentsGoneSince(ctx, now.Add(-15*time.Second).UnixMicro())
				return err
			})
			return listed
		}
		lastSeen := func() int64 {
			t.Helper()
			as, err := st.SiteAgents(ctx)
			if err != nil || len(as) != 1 {
				t.Fatalf("site agents %+v: %v", as, err)
			}
			return as[0].LastSeen
		}
		for i, conn := range []string{"c1", "c2"} {
			connect(conn)
			left := now.UnixMicro()
			write(func(tx *store.Tx) error { return tx.AgentGone(ctx, id, conn) })
			now = now.Add(20 * time.Second)
			if got := gone(); !slices.Equal(got, []string{id}) {
				t.Fatalf("departure %d: the reaper lists %v, want the agent", i+1, got)
			}
			write(func(tx *store.Tx) error { return tx.MarkAgentReaped(ctx, id) })
			if got := gone(); len(got) != 0 {
				t.Errorf("departure %d, reaped: the reaper lists %v, want none", i+1, got)
			}
			if got := lastSeen(); got != left {
				t.Errorf("departure %d, reaped: last seen %d, want %d (when it left)", i+1, got, left)
			}
			var still bool
			write(func(tx *store.Tx) (err error) {
				still, err = tx.StillGoneSince(ctx, id, now.UnixMicro())
				return err
			})
			if still {
				t.Errorf("departure %d, reaped: still gone for the reaper", i+1)
			}
		}
	})
}

// clockedWrites sets st's clock to *now (as the test moves it) and returns a write that fails
// the test on an error.
func clockedWrites(t *testing.T, st *store.Store, now *time.Time) func(f func(tx *store.Tx) error) {
	st.SetClock(func() time.Time { return *now })
	return func(f func(tx *store.Tx) error) {
		t.Helper()
		if err := st.Write(context.Background(), f); err != nil {
			t.Fatal(err)
		}
	}
}
