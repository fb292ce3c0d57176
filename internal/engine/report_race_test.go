package engine

import (
	"context"
	"slices"
	"testing"

	"bcd/internal/gateway"
	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// On PostgreSQL a report's transaction updates its command's row in the round trip of the
// node's lock only if the row is still as read before the transaction. A command given up
// in between (the workflow aborted, on another server) is read again in the transaction: the
// agent's late success is not recorded over it, and it ends the cancel the agent was told of
// (which the store would otherwise keep).
func TestReportOnACommandGivenUpSinceItWasRead(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		if st.Engine() != store.Postgres {
			t.Skip("the read before the writer is PostgreSQL's")
		}
		ctx := context.Background()
		f, id := siteAgentTakesStep(t, st)
		a := f.site
		f.e.afterPreRead = func() {
			f.e.afterPreRead = nil
			abortNode(t, f.st, f.node.ID)
			f.run(t)
		}
		if err := f.e.Report(ctx, a, Update{CommandID: id, State: "succeeded", Result: []byte(`{"power":"on"}`)}); err != nil {
			t.Fatal(err)
		}
		if f.e.afterPreRead != nil {
			t.Fatal("the report did not read its command before its transaction")
		}
		c := f.commands(t, "bmc.query")[0]
		if c.State != "failed" || c.Result != "" {
			t.Errorf("the given-up command is %s with result %q after the late success, want failed with none", c.State, c.Result)
		}
		var q any = f.e.Gateway()
		ref := gateway.AgentRef{Kind: pki.KindSiteAgent, AgentID: a.ID, SiteID: a.SiteID}
		if ids, err := q.(gateway.Canceller).Cancels(ctx, ref); err != nil || slices.Contains(ids, id) {
			t.Errorf("cancels after the agent's report: %v %v, want the report to end its cancel", ids, err)
		}
		if pending, err := st.PendingCancels(ctx, a.ID); err != nil || len(pending) != 0 {
			t.Errorf("cancels the store holds after the agent's report: %+v %v, want none", pending, err)
		}
	})
}

// siteAgentTakesStep starts a workflow whose one step (power.getPower) sends the site agent a
// command, and has the agent connect, claim it and acknowledge it: the fixture, and the
// command's id.
func siteAgentTakesStep(t *testing.T, st *store.Store) (*wfFixture, string) {
	t.Helper()
	ctx := context.Background()
	f := newWFFixture(t, st, "rescue", "deployed", []workflow.Step{{Use: "power.getPower"}}, []workflow.Step{{Use: "boot.cleanUp"}}, Config{})
	f.run(t)
	a := f.site
	if err := f.e.Connected(ctx, a, "v"); err != nil {
		t.Fatal(err)
	}
	cmds, err := f.e.Claim(ctx, a, 10)
	if err != nil || len(cmds) != 1 {
		t.Fatalf("claimed %d, %v", len(cmds), err)
	}
	if err := f.e.Ack(ctx, a, cmds[0].ID); err != nil {
		t.Fatal(err)
	}
	return f, cmds[0].ID
}
