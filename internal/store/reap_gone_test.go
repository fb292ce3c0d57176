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
		st.SetClock(func() time.Time { return now })
		write := func(f func(tx *store.Tx) error) {
			t.Helper()
			if err := st.Write(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
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
