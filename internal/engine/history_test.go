package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// The engine deletes, past their retentions, ended workflows (with their commands), commands of
// no workflow and events,
// in as many bounded passes as it takes; a negative retention keeps them for ever.
func TestPurgeHistoryByRetention(t *testing.T) {
	day := 24 * time.Hour
	cases := []struct {
		name                            string
		history, events                 time.Duration
		after                           time.Duration // the clock moves on by this much
		wantWorkflows, wantLoose, wantE int           // deleted
	}{
		{"defaults, within both", 0, 0, 89 * day, 0, 0, 0},
		{"defaults, past history only", 0, 0, 91 * day, 250, 1500, 0},
		{"defaults, past both", 0, 0, 366 * day, 250, 1500, 2500},
		{"kept for ever", -1, -1, 1000 * day, 0, 0, 0},
		{"short retentions", 2 * day, 3 * day, 4 * day, 250, 1500, 2500},
		{"history kept, events not", -1, 2 * day, 4 * day, 0, 0, 2500},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				clk := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
				st.SetClock(clk.Now)
				// 250 ended workflows of one plan (three passes of historyWorkflowsPerPass), one
				// finished command each, 1 500 finished commands of no workflow (two passes) and 2 500
				// events (two passes of historyEventsPerPass).
				err := st.Write(ctx, func(tx *store.Tx) error {
					var evs []store.Event
					for i := range 250 {
						w := store.Workflow{NodeID: "n", TenantID: "t", Profile: "metal-inspect", Owner: "metal", NodeState: "inspecting",
							Steps: "[]", Cleanup: "[]", State: wfSucceeded, Phase: "done", OutcomeApplied: true, FinishedAt: tx.At() + int64(i)}
						if err := tx.InsertWorkflow(ctx, &w); err != nil {
							return err
						}
						cmd := store.Command{NodeID: "n", TenantID: "t", SiteID: "s", Kind: "bmc.query", Args: "{}", RunsOn: "site", WorkflowID: w.ID, State: "succeeded"}
						if err := tx.InsertCommand(ctx, &cmd); err != nil {
							return err
						}
					}
					for i := range 1500 {
						cmd := store.Command{NodeID: "n", TenantID: "t", SiteID: "s", Kind: "bmc.power", Args: "{}", RunsOn: "site", State: "succeeded", FinishedAt: tx.At() + int64(i)}
						if err := tx.InsertCommand(ctx, &cmd); err != nil {
							return err
						}
					}
					for range 2500 {
						evs = append(evs, store.Event{TenantID: "t", NodeID: "n", Actor: "test", Kind: "test.event"})
					}
					return tx.AppendEvents(ctx, evs)
				})
				if err != nil {
					t.Fatal(err)
				}
				clk.Add(c.after + time.Hour)
				e := New(st, nil, nil, Config{HistoryRetention: c.history, EventRetention: c.events})
				got, err := e.PurgeHistory(ctx)
				if err != nil {
					t.Fatal(err)
				}
				want := store.Purged{Workflows: c.wantWorkflows, Commands: c.wantWorkflows + c.wantLoose, Loose: c.wantLoose, Events: c.wantE}
				if c.wantWorkflows > 0 {
					want.Plans = 1 // (the workflows' one plan, which none names any more)
				}
				if got != want {
					t.Fatalf("deleted %+v, want %+v", got, want)
				}
			})
		})
	}
}

// A retention shorter than a day is refused, saying what is accepted.
func TestRetentionChecked(t *testing.T) {
	cases := []struct {
		history, events time.Duration
		want            string
	}{
		{0, 0, ""},
		{-1, -1, ""},
		{24 * time.Hour, 48 * time.Hour, ""},
		{90 * time.Minute, 0, "history retention 1h30m0s: accepted is 24h0m0s or more"},
		{0, time.Second, "event retention 1s: accepted is 24h0m0s or more"},
	}
	for _, c := range cases {
		err := Config{HistoryRetention: c.history, EventRetention: c.events}.Check()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s/%s: %v, want accepted", c.history, c.events, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s/%s: %v, want %q", c.history, c.events, err, c.want)
		}
	}
}
