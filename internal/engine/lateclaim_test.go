package engine

import (
	"context"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// A claim of a connection that ended while the claim was in flight (the gateway's stream
// ended and Disconnected ran, then the claim reached the writer) takes nothing: its commands
// would go to a dead stream, assigned to an agent whose departure was already applied (or is
// about to be), and stay there, never released to the site's other agents. Nor does the late
// claim make the dead connection look alive to the next heartbeat.
func TestClaimOfADepartedConnectionTakesNothing(t *testing.T) {
	for _, reaped := range []bool{false, true} {
		name := "before the reap"
		if reaped {
			name = "after the reap"
		}
		t.Run(name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				f := newWFFixture(t, st, "rescue", "deployed", []workflow.Step{{Use: "power.getPower"}}, nil, Config{AgentGrace: time.Second})
				f.run(t)
				a := f.site
				if err := f.e.Connected(ctx, a, "v"); err != nil {
					t.Fatal(err)
				}
				if err := f.e.Disconnected(ctx, a); err != nil {
					t.Fatal(err)
				}
				if reaped {
					f.clock.Add(2 * time.Second)
					if _, err := f.e.ReapForTests(ctx); err != nil {
						t.Fatal(err)
					}
				}
				late, err := f.e.Claim(ctx, a, 10)
				if err != nil {
					t.Fatal(err)
				}
				if len(late) != 0 {
					t.Errorf("the departed connection's claim took %d commands", len(late))
				}
				q := f.commands(t, "bmc.query")
				if len(q) != 1 || q[0].TargetAgent != "" || q[0].State != "queued" {
					t.Fatalf("the query after the late claim: %+v", q)
				}
				f.e.sentMu.Lock()
				live := f.e.sent[a.ID].on(a.ConnID) != nil && !f.e.sent[a.ID].gone
				f.e.sentMu.Unlock()
				if live {
					t.Error("the late claim recorded the departed connection as live (a heartbeat would reassert it)")
				}
				// Another agent of the site takes it.
				b := Agent{ID: "site-b1", Kind: "site", SiteID: f.node.SiteID, ConnID: "conn-b"}
				if err := f.e.Connected(ctx, b, "v"); err != nil {
					t.Fatal(err)
				}
				got, err := f.e.Claim(ctx, b, 10)
				if err != nil || len(got) != 1 {
					t.Fatalf("the site's other agent claimed %d commands, %v", len(got), err)
				}
				// The first agent, back on a new connection, is offered what is its own again.
				a.ConnID = "conn-2"
				if err := f.e.Connected(ctx, a, "v"); err != nil {
					t.Fatal(err)
				}
				if _, err := f.e.Claim(ctx, a, 10); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}
