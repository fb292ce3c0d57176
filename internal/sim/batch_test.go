package sim

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/auth"
	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

var (
	alice = auth.Principal{Name: "alice", Role: auth.Approver}
	bob   = auth.Principal{Name: "bob", Role: auth.Approver}
)

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // generous: CI machines are shared
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// heldAtFirstStep waits until every node's workflow exists and waits before its first step.
func heldAtFirstStep(t *testing.T, st *store.Store, ids []string) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, "workflows held before their first step", func() bool {
		for _, id := range ids {
			wfs, err := st.Workflows(ctx, id, 1)
			if err != nil || len(wfs) == 0 || wfs[0].OutcomeApplied || wfs[0].BatchID == "" || wfs[0].StepStartedAt != 0 {
				return false
			}
		}
		return true
	})
	for _, id := range ids {
		wfs, _ := st.Workflows(ctx, id, 1)
		cmds, _ := st.Commands(ctx, id, 1000)
		for _, c := range cmds {
			if c.WorkflowID == wfs[0].ID {
				t.Fatalf("node %s: command %s %s was queued while its batch is held", id, c.Kind, c.State)
			}
		}
	}
}

func TestBulkQuorumOfTwo(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 3)
	rest(t, h, ids)
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 2); err != nil {
		t.Fatal(err)
	}
	res, err := h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "retire", Nodes: append(slices.Clone(ids), "nope"), Reason: "decommission rack 4"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Held || res.Batch.Required != 2 || res.Batch.Size != 3 || len(res.Nodes) != 4 || res.Nodes[3].Accepted {
		t.Fatalf("bulk answer: held=%v required=%d size=%d nodes=%+v", res.Held, res.Batch.Required, res.Batch.Size, res.Nodes)
	}
	heldAtFirstStep(t, st, ids)
	// The requester cannot approve their own batch.
	var forb *metal.ForbiddenError
	if _, err := h.Metal.Approve(ctx, h.Admin, res.Batch.ID, ""); !errors.As(err, &forb) {
		t.Fatalf("self-approval: %v", err)
	}
	// An operator cannot approve at all.
	if _, err := h.Metal.Approve(ctx, auth.Principal{Name: "op", Role: auth.Operator}, res.Batch.ID, ""); !errors.As(err, &forb) {
		t.Fatalf("operator approval: %v", err)
	}
	b, err := h.Metal.Approve(ctx, alice, res.Batch.ID, "checked the list")
	if err != nil || b.State != store.BatchPending || len(b.Approvers) != 1 {
		t.Fatalf("first approval: %s %v %v", b.State, b.Approvers, err)
	}
	if _, err := h.Metal.Approve(ctx, alice, res.Batch.ID, ""); err == nil {
		t.Fatal("alice approved twice")
	}
	heldAtFirstStep(t, st, ids) // one approval of two holds everything still
	// Approved at the quorum; the engine may already have started it by the time it is read.
	if b, err = h.Metal.Approve(ctx, bob, res.Batch.ID, ""); err != nil || b.State != store.BatchApproved && b.State != store.BatchRunning {
		t.Fatalf("second approval: %s %v", b.State, err)
	}
	for _, n := range rest(t, h, ids) {
		if n.State != "retired" || n.BatchID != "" {
			t.Fatalf("%s: %s batch=%q (%s)", n.Name, n.State, n.BatchID, n.FaultMsg)
		}
	}
	b, _ = st.Batch(ctx, res.Batch.ID)
	if b.State != store.BatchRunning || b.Parked != 0 {
		t.Fatalf("batch after the run: %s parked=%d", b.State, b.Parked)
	}
	// Started: approvals can no longer be withdrawn, nor the batch rejected.
	if _, err := h.Metal.Withdraw(ctx, alice, b.ID, ""); err == nil {
		t.Fatal("withdrawal after the start was accepted")
	}
	if _, err := h.Metal.Reject(ctx, alice, b.ID, ""); err == nil {
		t.Fatal("rejection after the start was accepted")
	}
	evs, _ := st.Events(ctx, store.EventFilter{Limit: 100000})
	for _, e := range evs {
		if e.Kind == "command.refused" {
			t.Fatalf("a command was refused under the approved batch: %s", e.Reason)
		}
	}
}

func TestWithdrawAndRejectReturnNodes(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 2)
	rest(t, h, ids)
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "installation", "", 2); err != nil {
		t.Fatal(err)
	}
	res, err := h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "inspect", Selectors: []string{}, Nodes: ids, Reason: "re-inspect"})
	if err != nil || !res.Held {
		t.Fatalf("bulk: %+v %v", res, err)
	}
	heldAtFirstStep(t, st, ids)
	if _, err := h.Metal.Approve(ctx, alice, res.Batch.ID, ""); err != nil {
		t.Fatal(err)
	}
	b, err := h.Metal.Withdraw(ctx, alice, res.Batch.ID, "wrong rack")
	if err != nil || len(b.Approvers) != 0 || b.State != store.BatchPending {
		t.Fatalf("withdraw: %+v %v", b, err)
	}
	if _, err := h.Metal.Withdraw(ctx, bob, res.Batch.ID, ""); err == nil {
		t.Fatal("bob withdrew an approval he never gave")
	}
	if b, err = h.Metal.Reject(ctx, bob, res.Batch.ID, "not this week"); err != nil || b.State != store.BatchRejected {
		t.Fatalf("reject: %s %v", b.State, err)
	}
	// Nothing ran: each node is back where the verb found it.
	for _, n := range rest(t, h, ids) {
		if n.State != "ready" || n.TargetState != "" || n.BatchID != "" || n.Maintenance {
			t.Fatalf("%s after rejection: %s target=%q batch=%q maint=%v", n.Name, n.State, n.TargetState, n.BatchID, n.Maintenance)
		}
		wfs, _ := st.Workflows(ctx, n.ID, 1)
		if wfs[0].FaultCode != "BATCH_REJECTED" || wfs[0].StepIndex != 0 {
			t.Fatalf("%s: workflow %s fault=%s step=%d", n.Name, wfs[0].Profile, wfs[0].FaultCode, wfs[0].StepIndex)
		}
	}
	if _, err := h.Metal.Approve(ctx, alice, res.Batch.ID, ""); err == nil {
		t.Fatal("a rejected batch was approved")
	}
}

// TestDestructiveCommandsNeedTheirLeaf drives the queue by hand: a destructive command outside
// any batch is refused and recorded; a held power command goes once approved; its batch lists
// one leaf per site agent known when it was created, so a reroute to another of them is sent,
// and an agent that joined later is refused.
func TestDestructiveCommandsNeedTheirLeaf(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	h.Stop()
	eng := engine.New(st, nil, nil2(), engine.Config{AgentGrace: time.Millisecond})
	a := engine.Agent{ID: "agent-a", Kind: "site", SiteID: h.SiteID, ConnID: "c1"}
	b := engine.Agent{ID: "agent-b", Kind: "site", SiteID: h.SiteID, ConnID: "c2"}
	c := engine.Agent{ID: "agent-c", Kind: "site", SiteID: h.SiteID, ConnID: "c3"}
	eng.Connected(ctx, a, "t")
	eng.Connected(ctx, b, "t")
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "site", "default", 1); err != nil {
		t.Fatal(err)
	}
	node, _ := st.Node(ctx, ids[0], "")

	// Outside any batch: refused, recorded, never offered.
	var stray store.Command
	err := st.Write(ctx, func(tx *store.Tx) error {
		stray = store.Command{NodeID: node.ID, TenantID: node.TenantID, SiteID: node.SiteID, Kind: "bmc.power", Subject: "bmc:" + node.BMCAddress,
			Args: `{"action":"off"}`, RunsOn: "site", Destructive: true, Reroutable: true}
		return tx.InsertCommand(ctx, &stray)
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := eng.Claim(ctx, a, 10); err != nil || len(got) != 0 {
		t.Fatalf("claim outside any batch: %d commands, %v", len(got), err)
	}
	stray, _ = st.Command(ctx, stray.ID)
	if stray.State != "failed" || !strings.Contains(stray.Error, "outside any batch") {
		t.Fatalf("stray command: %s %q", stray.State, stray.Error)
	}
	if !hasEvent(t, st, node.ID, "command.refused", stray.ID) {
		t.Fatal("the refusal was not recorded")
	}

	// Two power commands, each held under its own one-node batch until approved.
	var cmds []string
	for _, action := range []string{"off", "on"} {
		_, id, err := h.Metal.Apply(ctx, h.Admin, provision.VerbPower, metal.VerbInput{Node: node.ID, PowerAction: action})
		if err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, id)
	}
	if got, _ := eng.Claim(ctx, a, 10); len(got) != 0 {
		t.Fatalf("held commands were offered: %d", len(got))
	}
	for _, id := range cmds {
		cmd, _ := st.Command(ctx, id)
		if cmd.State != "held" || cmd.BatchID == "" {
			t.Fatalf("power command: %s batch=%q", cmd.State, cmd.BatchID)
		}
		if _, err := h.Metal.Approve(ctx, alice, cmd.BatchID, ""); err != nil {
			t.Fatal(err)
		}
	}
	// A takes both and goes away without acknowledging: they are released for another agent.
	if got, err := eng.Claim(ctx, a, 10); err != nil || len(got) != 2 {
		t.Fatalf("claim by A after approval: %d %v", len(got), err)
	}
	eng.Disconnected(ctx, a)
	time.Sleep(5 * time.Millisecond) // past the (1 ms) grace; the reaper runs on demand below
	if _, err := eng.ReapForTests(ctx); err != nil {
		t.Fatal(err)
	}
	// B was a site agent when the batches were made: the reroute is covered.
	got, err := eng.Claim(ctx, b, 1)
	if err != nil || len(got) != 1 || got[0].ID != cmds[0] {
		t.Fatalf("B after failover: %d commands %v", len(got), err)
	}
	// C joined later: no leaf of the batch names it.
	eng.Connected(ctx, c, "t")
	if got, err := eng.Claim(ctx, c, 10); err != nil || len(got) != 0 {
		t.Fatalf("C (joined after the scope was fixed): %d commands %v", len(got), err)
	}
	late, _ := st.Command(ctx, cmds[1])
	if late.State != "failed" || !strings.Contains(late.Error, "does not list (bmc:agent-c/") {
		t.Fatalf("command offered to C: %s %q", late.State, late.Error)
	}
}

func hasEvent(t *testing.T, st *store.Store, nodeID, kind, contains string) bool {
	t.Helper()
	evs, err := st.Events(context.Background(), store.EventFilter{NodeID: nodeID, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Kind == kind && strings.Contains(e.Data, contains) {
			return true
		}
	}
	return false
}

// TestPluginStepMustDeclareSends: a deploy profile whose plugin step relays site.httpProxy
// without declaring it is refused before anything is sent; declared, its leaf (node:<target>)
// is in the one-node batch's scope.
func TestPluginStepMustDeclareSends(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 2)
	rest(t, h, ids)
	if err := h.Metal.PutDeployProfile(ctx, h.Admin, "undeclared", `{"steps":[{"use":"plugin.httpViaSite"}]}`); err != nil {
		t.Fatal(err)
	}
	if err := h.Metal.PutDeployProfile(ctx, h.Admin, "declared", `{"steps":[{"use":"plugin.httpViaSite"}],"sends":["site.httpProxy"]}`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "installation", "", 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.Metal.Apply(ctx, h.Admin, provision.VerbDeploy, metal.VerbInput{Node: ids[0], Image: "img", Profile: "undeclared"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.Metal.Apply(ctx, h.Admin, provision.VerbDeploy, metal.VerbInput{Node: ids[1], Image: "img", Profile: "declared"}); err != nil {
		t.Fatal(err)
	}
	h.Engine.Nudge()
	// Undeclared: nothing destructive is left in the profile's kinds, so no batch; the step
	// itself is refused.
	got := rest(t, h, ids[:1])
	if n := got[ids[0]]; n.State != "failed" || !strings.Contains(n.FaultMsg, "does not declare") {
		t.Fatalf("undeclared sends: %s %q", n.State, n.FaultMsg)
	}
	// Declared: held under a one-node batch that lists node:<target> for site.httpProxy.
	heldAtFirstStep(t, st, ids[1:])
	wfs, _ := st.Workflows(ctx, ids[1], 1)
	_, leaves, err := h.Metal.Batch(ctx, alice, wfs[0].BatchID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(leaves, store.Leaf{Subject: "node:" + ids[1], Kind: "site.httpProxy"}) {
		t.Fatalf("declared sends: leaves %v", leaves)
	}
	cmds, _ := st.Commands(ctx, ids[0], 1000)
	for _, c := range cmds {
		if c.Kind == "site.httpProxy" {
			t.Fatalf("an undeclared site.httpProxy was queued: %+v", c)
		}
	}
}

// TestAbortBeforeApprovalCancelsTheBatch: a node aborted while its one-node batch waits leaves
// it; the batch, with no node left, is cancelled and can no longer be approved.
func TestAbortBeforeApprovalCancelsTheBatch(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.Metal.Apply(ctx, h.Admin, provision.VerbRetire, metal.VerbInput{Node: ids[0]}); err != nil {
		t.Fatal(err)
	}
	h.Engine.Nudge()
	heldAtFirstStep(t, st, ids)
	wfs, _ := st.Workflows(ctx, ids[0], 1)
	if _, _, err := h.Metal.Apply(ctx, h.Admin, provision.VerbAbort, metal.VerbInput{Node: ids[0]}); err != nil {
		t.Fatal(err)
	}
	h.Engine.Nudge()
	waitFor(t, "the batch cancelled", func() bool {
		b, err := st.Batch(ctx, wfs[0].BatchID)
		return err == nil && b.State == store.BatchCancelled && b.Parked == 0
	})
	if _, err := h.Metal.Approve(ctx, alice, wfs[0].BatchID, ""); err == nil {
		t.Fatal("a cancelled batch was approved")
	}
	if list, _ := h.Metal.PendingBatches(ctx, alice, 10); len(list) != 0 {
		t.Fatalf("doctor still lists %d pending batches", len(list))
	}
}

// A batch nobody approves is rejected by the system at the approval deadline (every wait has
// one): each node's workflow is woken then, ends BATCH_REJECTED, and the node returns to
// where its verb found it; the batch records why.
func TestUnapprovedBatchExpires(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 2)
	rest(t, h, ids)
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "installation", "", 2); err != nil {
		t.Fatal(err)
	}
	h.Stop()
	eng := engine.New(st, nil, nil2(), engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond, ApprovalTimeout: 500 * time.Millisecond})
	defer runEngine(t, eng)()
	res, err := h.Metal.Bulk(ctx, h.Admin, metal.BulkInput{Pool: "default", Verb: "inspect", Nodes: ids, Reason: "re-inspect"})
	if err != nil || !res.Held {
		t.Fatalf("bulk: %+v %v", res, err)
	}
	waitFor(t, "the unapproved batch to expire and its nodes to return", func() bool {
		for _, id := range ids {
			n, err := st.Node(ctx, id, "")
			if err != nil {
				t.Fatal(err)
			}
			if n.State != "ready" || n.BatchID != "" {
				return false
			}
		}
		return true
	})
	b, err := st.Batch(ctx, res.Batch.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.State != store.BatchRejected || b.DecidedBy != "system" || !strings.Contains(b.DecisionReason, "not approved within") {
		t.Fatalf("batch %s by %s: %q", b.State, b.DecidedBy, b.DecisionReason)
	}
	for _, id := range ids {
		wfs, _ := st.Workflows(ctx, id, 1)
		if wfs[0].FaultCode != "BATCH_REJECTED" || wfs[0].StepIndex != 0 {
			t.Fatalf("%s: workflow %s fault=%s step=%d", id, wfs[0].Profile, wfs[0].FaultCode, wfs[0].StepIndex)
		}
	}
}
