package sim

import (
	"context"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// startSlow starts a harness with n enrolled nodes whose every command takes lat (start: none),
// so that, say, an aborted workflow's cleanup (boot.cleanUp on the site agent) takes a moment.
func startSlow(t *testing.T, st *store.Store, n int, lat time.Duration) (*Harness, []string) {
	t.Helper()
	h := startEmpty(t, st, lat)
	ids, err := h.Enroll(context.Background(), "e", n)
	if err != nil {
		t.Fatal(err)
	}
	return h, ids
}

// startEmpty starts a harness with no node, whose every command takes lat (start: none).
func startEmpty(t *testing.T, st *store.Store, lat time.Duration) *Harness {
	t.Helper()
	h, err := Start(context.Background(), st, Config{Latency: lat}, engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	return h
}

func workflowsOf(t *testing.T, st *store.Store, id string) []store.Workflow {
	t.Helper()
	wfs, err := st.Workflows(context.Background(), id, 100)
	if err != nil {
		t.Fatal(err)
	}
	return wfs
}

// waitStepped waits until the node's newest workflow runs under batch and took a step.
func waitStepped(t *testing.T, st *store.Store, id, profile string) store.Workflow {
	t.Helper()
	var wf store.Workflow
	waitFor(t, profile+" running past its first step", func() bool {
		wfs := workflowsOf(t, st, id)
		if len(wfs) == 0 || wfs[0].Profile != profile || wfs[0].OutcomeApplied || wfs[0].StepIndex < 2 {
			return false
		}
		wf = wfs[0]
		return true
	})
	return wf
}

// An approved retire aborted mid-run and recovered at once (before the aborted workflow's
// cleanup ended): the recovery is a new chain and runs under a new batch, which needs its own
// approval; it never runs under the aborted chain's approved one.
func TestRecoverAfterAbortNeedsItsOwnApproval(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := startSlow(t, st, 1, 300*time.Millisecond)
	rest(t, h, ids)
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	if err := h.Apply(ctx, provision.VerbRetire, ids, metal.VerbInput{Reason: "decommission"}); err != nil {
		t.Fatal(err)
	}
	heldAtFirstStep(t, st, ids)
	first := workflowsOf(t, st, ids[0])[0]
	if _, err := h.Metal.Approve(ctx, alice, first.BatchID, "ok to retire"); err != nil {
		t.Fatal(err)
	}
	waitStepped(t, st, ids[0], "metal-retire")
	// Abort, then recover at once.
	if err := h.Apply(ctx, provision.VerbAbort, ids, metal.VerbInput{Reason: "stop"}); err != nil {
		t.Fatal(err)
	}
	if err := h.Apply(ctx, provision.VerbRecover, ids, metal.VerbInput{Reason: "try again"}); err != nil {
		t.Fatal(err)
	}
	next := heldUnderNewBatch(t, st, ids[0], first)
	if _, err := h.Metal.Approve(ctx, alice, next.BatchID, "recover ok"); err != nil {
		t.Fatal(err)
	}
	if got := rest(t, h, ids)[ids[0]]; got.State != "retired" {
		t.Fatalf("after the recovery's approval: %s %s", got.State, got.FaultMsg)
	}
}

// heldUnderNewBatch waits until node id's newest workflow, a new one after aborted, waits under
// a pending batch other than aborted's, having sent no destructive command, and returns it.
func heldUnderNewBatch(t *testing.T, st *store.Store, id string, aborted store.Workflow) store.Workflow {
	t.Helper()
	ctx := context.Background()
	var wf store.Workflow
	waitFor(t, "the new chain held under a new batch", func() bool {
		wfs := workflowsOf(t, st, id)
		if len(wfs) == 0 || wfs[0].ID == aborted.ID || wfs[0].BatchID == "" {
			return false
		}
		if wfs[0].BatchID == aborted.BatchID {
			t.Fatalf("the new workflow %s (%s) runs under the aborted chain's batch %s", wfs[0].ID, wfs[0].Profile, aborted.BatchID)
		}
		b, err := st.Batch(ctx, wfs[0].BatchID)
		if err != nil {
			t.Fatal(err)
		}
		if b.State != store.BatchPending {
			t.Fatalf("the new chain's batch %s is %s before any approval", b.ID, b.State)
		}
		wf = wfs[0]
		return true
	})
	cmds, err := st.Commands(ctx, id, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if c.WorkflowID == wf.ID && c.Destructive && c.State != "held" {
			t.Fatalf("the new chain sent %s (%s) before its approval", c.Kind, c.State)
		}
	}
	return wf
}

// An approved undeploy (quick wipe) aborted mid-run, then, within the aborted workflow's
// cleanup, maintenance off and a retire: the retire (secure erase, power off) never runs under
// the release's approval.
func TestRetireAfterAbortedReleaseNeedsItsOwnApproval(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := startSlow(t, st, 1, 300*time.Millisecond)
	rest(t, h, ids)
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"}); err != nil {
		t.Fatal(err)
	}
	if n := rest(t, h, ids)[ids[0]]; n.State != "deployed" {
		t.Fatalf("deploy: %s %s", n.State, n.FaultMsg)
	}
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	if err := h.Apply(ctx, provision.VerbUndeploy, ids, metal.VerbInput{Reason: "tenant left", Wipe: "quick"}); err != nil {
		t.Fatal(err)
	}
	heldAtFirstStep(t, st, ids)
	rel := workflowsOf(t, st, ids[0])[0]
	b, _ := st.Batch(ctx, rel.BatchID)
	t.Logf("release batch %s verb=%s reason=%q", b.ID, b.Verb, b.Reason)
	if _, err := h.Metal.Approve(ctx, alice, rel.BatchID, "release ok"); err != nil {
		t.Fatal(err)
	}
	waitStepped(t, st, ids[0], "metal-release")
	for _, step := range []struct {
		v  provision.Verb
		in metal.VerbInput
	}{
		{provision.VerbAbort, metal.VerbInput{Reason: "stop"}},
		{provision.VerbMaintenance, metal.VerbInput{Reason: "off", MaintenanceOn: false}},
		{provision.VerbRetire, metal.VerbInput{Reason: "retire instead"}},
	} {
		if err := h.Apply(ctx, step.v, ids, step.in); err != nil {
			t.Fatalf("%s: %v", step.v, err)
		}
	}
	next := heldUnderNewBatch(t, st, ids[0], rel)
	if next.Profile != "metal-retire" {
		t.Fatalf("held %s, want the retire", next.Profile)
	}
	if _, err := h.Metal.Approve(ctx, alice, next.BatchID, "retire ok"); err != nil {
		t.Fatal(err)
	}
	if got := rest(t, h, ids)[ids[0]]; got.State != "retired" {
		t.Fatalf("after the retire's approval: %s %s", got.State, got.FaultMsg)
	}
}

// A retire of a ready node waits for approval; an operator turns maintenance on and off
// meanwhile: the rejection still returns the node to ready, as documented (the maintenance verb
// does not overwrite where the chain came from).
func TestRejectAfterMaintenanceToggleReturnsTheNode(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	if err := h.Apply(ctx, provision.VerbRetire, ids, metal.VerbInput{Reason: "r"}); err != nil {
		t.Fatal(err)
	}
	heldAtFirstStep(t, st, ids)
	for _, on := range []bool{true, false} {
		if err := h.Apply(ctx, provision.VerbMaintenance, ids, metal.VerbInput{MaintenanceOn: on, Reason: "m"}); err != nil {
			t.Fatal(err)
		}
	}
	n0, _ := st.Node(ctx, ids[0], "")
	wf := workflowsOf(t, st, ids[0])[0]
	b, _ := st.Batch(ctx, wf.BatchID)
	if _, err := h.Metal.Reject(ctx, bob, wf.BatchID, "no"); err != nil {
		t.Fatal(err)
	}
	n := rest(t, h, ids)[ids[0]]
	t.Logf("verb_from after the toggle: %q verb_by=%q (batch requested by %s); after reject: %s %s", n0.VerbFrom, n0.VerbBy, b.RequestedBy, n.State, n.FaultCode)
	if n.State != "ready" {
		t.Errorf("rejected retire of a ready node left it %s %s (maintenance=%v), not ready", n.State, n.FaultCode, n.Maintenance)
	}
}

// A policy raised while a batch waits applies to it: one approval of two no longer opens it, and
// the second approver's does.
func TestPolicyRaisedWhilePendingApplies(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	res, err := h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "retire", Nodes: ids, Reason: "decommission"})
	if err != nil {
		t.Fatal(err)
	}
	heldAtFirstStep(t, st, ids)
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 2); err != nil {
		t.Fatal(err)
	}
	b, err := h.Metal.Approve(ctx, alice, res.Batch.ID, "one of two")
	if err != nil || b.State != store.BatchPending || b.Required != 2 {
		t.Fatalf("the first approval under a policy of 2: %s, required %d, %v", b.State, b.Required, err)
	}
	if stored, err := st.Batch(ctx, b.ID); err != nil || stored.Required != 2 {
		t.Fatalf("stored batch requires %d (%v), want 2", stored.Required, err)
	}
	if b, err = h.Metal.Approve(ctx, bob, res.Batch.ID, "two of two"); err != nil || b.State != store.BatchApproved && b.State != store.BatchRunning {
		t.Fatalf("the second approval: %s %v", b.State, err)
	}
	if n := rest(t, h, ids)[ids[0]]; n.State != "retired" {
		t.Fatalf("after two approvals: %s %s", n.State, n.FaultMsg)
	}
}

// An operator's power action approved and sent starts its batch: it can no longer be withdrawn
// or rejected, and the batch reads running, not approved.
func TestDirectBatchRunsOnceSent(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	_, cmdID, err := h.Metal.Apply(ctx, h.Admin, provision.VerbPower, metal.VerbInput{Node: ids[0], PowerAction: "off", Reason: "x"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := st.Command(ctx, cmdID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Metal.Approve(ctx, alice, c.BatchID, "ok"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the power command sent", func() bool {
		c, _ = st.Command(ctx, cmdID)
		return c.DeliveredAt > 0
	})
	if b, err := st.Batch(ctx, c.BatchID); err != nil || b.State != store.BatchRunning {
		t.Fatalf("after its command was sent, batch %s is %s (%v), want running", c.BatchID, b.State, err)
	}
	if _, err := h.Metal.Withdraw(ctx, alice, c.BatchID, "changed my mind"); err == nil {
		t.Error("an approval withdrawn after its batch's command was sent")
	}
	if _, err := h.Metal.Reject(ctx, bob, c.BatchID, "no"); err == nil {
		t.Error("a batch rejected after its command was sent")
	}
}

// Without an approval policy a node's chains make no batch: nothing would be approved. Its
// destructive commands (power cycles, wipes) still go out, through the queue's gate.
func TestNoBatchWithoutApprovals(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 2)
	rest(t, h, ids)
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"}); err != nil {
		t.Fatal(err)
	}
	rest(t, h, ids)
	if err := h.Apply(ctx, provision.VerbUndeploy, ids, metal.VerbInput{}); err != nil {
		t.Fatal(err)
	}
	for id, n := range rest(t, h, ids) {
		if n.State != "ready" || n.BatchID != "" {
			t.Fatalf("node %s after its life: %s, batch %q", id, n.State, n.BatchID)
		}
		destructive := 0
		cmds, err := st.Commands(ctx, id, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cmds {
			if c.BatchID != "" {
				t.Errorf("command %s %s runs under batch %s", c.ID, c.Kind, c.BatchID)
			}
			if c.Destructive && c.State == "succeeded" {
				destructive++
			}
		}
		if destructive == 0 {
			t.Errorf("node %s: no destructive command ran", id)
		}
		for _, wf := range workflowsOf(t, st, id) {
			if wf.BatchID != "" {
				t.Errorf("workflow %s (%s) runs under batch %s", wf.ID, wf.Profile, wf.BatchID)
			}
		}
		evs, err := st.Events(ctx, store.EventFilter{NodeID: id, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Kind == "batch.create" {
				t.Errorf("node %s: %s %s", id, e.Kind, e.Data)
			}
		}
	}
	if bs, err := st.Batches(ctx, store.BatchFilter{}); err != nil || len(bs) != 0 {
		t.Fatalf("%d batches (%v), want none", len(bs), err)
	}
}

// A policy raised while a chain runs without a batch holds the chain's next workflow for
// approval; approved, the rest of the chain runs under that batch.
func TestPolicyRaisedMidChainHoldsTheNextWorkflow(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h := startEmpty(t, st, 0)
	// The site agent takes nothing: enroll's first workflow waits at its power query.
	h.Sim.SetFaults(Faults{SitePaused: true})
	ids, err := h.Enroll(ctx, "e", 1)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "metal-enroll started", func() bool {
		wfs := workflowsOf(t, st, ids[0])
		return len(wfs) == 1 && wfs[0].Profile == "metal-enroll" && wfs[0].CurrentCommand != ""
	})
	if wf := workflowsOf(t, st, ids[0])[0]; wf.BatchID != "" {
		t.Fatalf("metal-enroll runs under batch %s with no policy", wf.BatchID)
	}
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	h.Sim.SetFaults(Faults{})
	heldAtFirstStep(t, st, ids)
	wf := workflowsOf(t, st, ids[0])[0]
	b, err := st.Batch(ctx, wf.BatchID)
	if err != nil || wf.Profile != "metal-inspect" || b.State != store.BatchPending || b.Required != 1 {
		t.Fatalf("after the policy: %s held under batch %s %s, required %d (%v); want metal-inspect, pending, 1", wf.Profile, b.ID, b.State, b.Required, err)
	}
	if _, err := h.Metal.Approve(ctx, alice, b.ID, "ok"); err != nil {
		t.Fatal(err)
	}
	if n := rest(t, h, ids)[ids[0]]; n.State != "ready" {
		t.Fatalf("after the approval: %s %s %s", n.State, n.FaultCode, n.FaultMsg)
	}
	for _, wf := range workflowsOf(t, st, ids[0]) {
		if want := map[string]string{"metal-enroll": "", "metal-inspect": b.ID, "metal-commission": b.ID}[wf.Profile]; wf.BatchID != want {
			t.Errorf("%s runs under batch %q, want %q", wf.Profile, wf.BatchID, want)
		}
	}
}
