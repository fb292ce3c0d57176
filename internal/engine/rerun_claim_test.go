package engine

import (
	"context"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// A write function may run more than once before its outcome (SQLite's writer runs a group
// again when a write of it failed; PostgreSQL retries a serialization failure). A claim marks
// what it offers on the agent's connection as it assigns it: a run whose writes are undone
// offers nothing, so the run that commits offers the commands (it once found them marked by
// the undone run and offered none, and the agent never received them).
func TestClaimRunAgainOffersWhatItAssigns(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		if st.Engine() != store.SQLite {
			t.Skip("the rehearsal is SQLite's writer's")
		}
		ctx := context.Background()
		f := newWFFixture(t, st, "rescue", "deployed", []workflow.Step{{Use: "power.getPower"}}, nil, Config{})
		f.run(t)
		st.RehearseWrites(true)
		defer st.RehearseWrites(false)
		got, err := f.e.Claim(ctx, f.site, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Kind != "bmc.query" {
			t.Fatalf("claimed %+v, want the workflow's bmc.query", got)
		}
		f.e.sentMu.Lock()
		offered := f.e.sent[f.site.ID].on(f.site.ConnID)[got[0].ID]
		f.e.sentMu.Unlock()
		if !offered {
			t.Error("the claimed command is not recorded as offered on the connection")
		}
		again, err := f.e.Claim(ctx, f.site, 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(again) != 0 {
			t.Errorf("a second claim offered %d commands again", len(again))
		}
	})
}
