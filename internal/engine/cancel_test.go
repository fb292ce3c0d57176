package engine

import (
	"context"
	"slices"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A workflow aborted (or a step timed out) while an agent runs the step's command gives the
// command up: the agent is told to cancel it (gateway.Canceller), once the change is committed,
// so that an interruptible command stops instead of running on under the cleanup; the
// agent's report on it ends the cancel.
func TestAbortedCommandIsCancelledOnItsAgent(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, f *wfFixture)
	}{
		{"abort", func(t *testing.T, f *wfFixture) {
			abortNode(t, f.st, f.node.ID)
		}},
		{"timeout", func(t *testing.T, f *wfFixture) {
			f.clock.Add(2 * time.Hour)
			if err := f.st.Write(context.Background(), func(tx *store.Tx) error { return tx.Wake(context.Background(), f.node.ID, "t", 0) }); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				f, id := siteAgentTakesStep(t, st)
				a := f.site
				if err := f.e.Report(ctx, a, Update{CommandID: id, State: "running"}); err != nil {
					t.Fatal(err)
				}
				var q any = f.e.Gateway()
				cc, ok := q.(gateway.Canceller)
				if !ok {
					t.Fatal("the engine's gateway adapter tells agents of no cancelled command (gateway.Canceller)")
				}
				ref := gateway.AgentRef{Kind: pki.KindSiteAgent, AgentID: a.ID, SiteID: a.SiteID}
				if ids, err := cc.Cancels(ctx, ref); err != nil || len(ids) != 0 {
					t.Fatalf("cancels before the abort: %v %v", ids, err)
				}
				tc.end(t, f)
				f.run(t)
				if c := f.commands(t, "bmc.query")[0]; c.State != "failed" {
					t.Fatalf("the given-up command is %s", c.State)
				}
				ids, err := cc.Cancels(ctx, ref)
				if err != nil || !slices.Equal(ids, []string{id}) {
					t.Fatalf("cancels after the step was given up: %v %v, want [%s]", ids, err, id)
				}
				other := gateway.AgentRef{Kind: pki.KindSiteAgent, AgentID: "site-other", SiteID: a.SiteID}
				if ids, _ := cc.Cancels(ctx, other); len(ids) != 0 {
					t.Errorf("another agent is told to cancel %v", ids)
				}
				// The agent's late report (it stopped, or could not be interrupted) ends it.
				if err := f.e.Report(ctx, a, Update{CommandID: id, State: "failed", Error: "cancelled"}); err != nil {
					t.Fatal(err)
				}
				if ids, _ := cc.Cancels(ctx, ref); len(ids) != 0 {
					t.Errorf("cancels after the agent's report: %v", ids)
				}
			})
		})
	}
}

// abortNode does what the abort verb does to a node in a workflow: failed from its state,
// maintenance on, its reconciler woken.
func abortNode(t *testing.T, st *store.Store, nodeID string) {
	t.Helper()
	if err := st.Write(context.Background(), func(tx *store.Tx) error {
		n, err := tx.LockNode(context.Background(), nodeID, "")
		if err != nil {
			return err
		}
		n.State, n.FailedFrom, n.Maintenance = "failed", n.State, true
		if err := tx.UpdateNode(context.Background(), &n); err != nil {
			return err
		}
		return tx.Wake(context.Background(), n.ID, "abort", 0)
	}); err != nil {
		t.Fatal(err)
	}
}
