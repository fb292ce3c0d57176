package engine

import (
	"context"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// A connection's claims look for the commands assigned to its agent but never offered on it
// (what another server's claim for the agent's previous connection took) at its first claim
// and then at most every AssignedRescan: within the interval a claim reads only unassigned
// commands, and such a command waits for the next look; a new connection looks at once.
func TestClaimsLookForAssignedCommandsOncePerRescan(t *testing.T) {
	cases := []struct {
		name    string
		rescan  time.Duration
		newConn bool
		want    int
	}{
		{"same connection, inside the interval", time.Hour, false, 0},
		{"same connection, the interval passed", time.Nanosecond, false, 1},
		{"a new connection", time.Hour, true, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				f := newWFFixture(t, st, "rescue", "deployed", []workflow.Step{{Use: "power.getPower"}}, nil, Config{AssignedRescan: tc.rescan})
				f.run(t)
				a := f.site
				if err := f.e.Connected(ctx, a, "v"); err != nil {
					t.Fatal(err)
				}
				if got, err := f.e.Claim(ctx, a, 10); err != nil || len(got) != 1 {
					t.Fatalf("first claim: %d commands, %v", len(got), err)
				}
				// Assigned to the agent behind this connection's back, as a claim of its previous
				// connection on another server would.
				var stray store.Command
				if err := st.Write(ctx, func(tx *store.Tx) error {
					stray = store.Command{NodeID: f.node.ID, TenantID: f.node.TenantID, SiteID: f.node.SiteID, Kind: "bmc.query",
						Args: "{}", RunsOn: "site", TargetAgent: a.ID}
					return tx.InsertCommand(ctx, &stray)
				}); err != nil {
					t.Fatal(err)
				}
				if tc.newConn {
					a.ConnID = "conn-2"
					if err := f.e.Connected(ctx, a, "v"); err != nil {
						t.Fatal(err)
					}
				}
				got, err := f.e.Claim(ctx, a, 10)
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, c := range got {
					if c.ID == stray.ID {
						n++
					}
				}
				if n != tc.want {
					t.Errorf("the claim returned the command assigned elsewhere %d times, want %d (claimed %d)", n, tc.want, len(got))
				}
			})
		})
	}
}
