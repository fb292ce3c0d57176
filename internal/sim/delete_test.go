package sim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/pki"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// siteAgentWithCert is a site agent with a real certificate, as gateway connections carry: BMC
// credentials are opened and encrypted to it.
func siteAgentWithCert(t *testing.T, siteID, id, conn string) engine.Agent {
	t.Helper()
	now := time.Now()
	ca, err := pki.CreateCA("test", now)
	if err != nil {
		t.Fatal(err)
	}
	_, csr, err := pki.NewKeyAndCSR(id)
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.IssueSiteAgent(csr, siteID, id, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	return engine.Agent{ID: id, Kind: "site", SiteID: siteID, ConnID: conn, CertDER: der}
}

// Deleting a node fails the commands no agent took (with the node's BMC secrets gone, a queued
// BMC command could never be sent, and stood, oldest first, in front of every claim of the
// site); it is refused while an agent runs one. A queued command whose credentials cannot be
// opened fails on its own and no longer blocks the site's other work.
func TestDeleteFailsQueuedCommandsAndClaimsGoOn(t *testing.T) {
	ctx := context.Background()
	st, h, node, _, _, _ := byHand(t, engine.Config{})
	eng := engine.New(st, nil, nil2(), engine.Config{Secrets: h.Metal, AgentGrace: time.Hour})
	a := siteAgentWithCert(t, h.SiteID, "agent-x", "cx")
	if err := eng.Connected(ctx, a, "t"); err != nil {
		t.Fatal(err)
	}
	// An agent running one of its commands: the delete is refused.
	power(t, h, node, "on")
	got, err := eng.Claim(ctx, a, 10)
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %d %v", len(got), err)
	}
	if err := eng.Ack(ctx, a, got[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := h.Metal.Delete(ctx, h.Admin, node, "gone"); !errors.Is(err, store.ErrConflict) || !strings.Contains(err.Error(), "an agent is running") {
		t.Fatalf("delete while an agent runs a command of the node: %v", err)
	}
	if err := eng.Report(ctx, a, engine.Update{CommandID: got[0].ID, State: "succeeded", Result: []byte(`{"power":"on"}`)}); err != nil {
		t.Fatal(err)
	}
	// Powered off, then deleted before any agent took the command: it fails with the node.
	power(t, h, node, "off")
	if err := h.Metal.Delete(ctx, h.Admin, node, "gone"); err != nil {
		t.Fatal(err)
	}
	cmds, err := st.Commands(ctx, node, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		if c.State == "queued" || c.State == "held" {
			t.Errorf("command %s %s of the deleted node is still %s", c.ID, c.Kind, c.State)
		}
	}

	// A BMC command whose secret is gone (as a delete before this change left them) fails on
	// its own at the claim; another node's command is handed out.
	ids, err := h.Enroll(ctx, "other", 1)
	if err != nil {
		t.Fatal(err)
	}
	orphan := store.Command{NodeID: node, SiteID: h.SiteID, Kind: "bmc.power", RunsOn: "site",
		Args: `{"action":"off","bmc":{"usernameRef":"secret://gone-user","passwordRef":"secret://gone-pass"}}`}
	if err := st.Write(ctx, func(tx *store.Tx) error { return tx.InsertCommand(ctx, &orphan) }); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var took []store.Command
	waitFor(t, "the other node's command claimed", func() bool {
		got, err := eng.Claim(ctx, a, 10)
		if err != nil {
			t.Fatalf("claim with an orphaned command queued: %v", err)
		}
		took = append(took, got...)
		for _, c := range took {
			if c.NodeID == ids[0] {
				return true
			}
		}
		_, _ = eng.RunOnce(ctx)
		return false
	})
	if c, _ := st.Command(ctx, orphan.ID); c.State != "failed" || !strings.Contains(c.Error, "credentials cannot be opened") {
		t.Fatalf("the orphaned command: %s (%s)", c.State, c.Error)
	}
}

// An operator's power action held for approval does not run in the middle of a workflow that
// took the node meanwhile: the workflow's start withdraws it (with an event), and approving
// its batch later sends nothing.
func TestWorkflowWithdrawsHeldDirectCommands(t *testing.T) {
	ctx := context.Background()
	st, h, node, eng, a, _ := byHand(t, engine.Config{AgentGrace: time.Hour})
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	_, cmdID, err := h.Metal.Apply(ctx, h.Admin, provision.VerbPower, metal.VerbInput{Node: node, PowerAction: "off"})
	if err != nil {
		t.Fatal(err)
	}
	held, _ := st.Command(ctx, cmdID)
	if held.State != "held" {
		t.Fatalf("power off: %s, want held for approval", held.State)
	}
	if err := h.Apply(ctx, provision.VerbDeploy, []string{node}, metal.VerbInput{Image: "img"}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	wf := openWorkflow(t, st, node)
	if c, _ := st.Command(ctx, cmdID); c.State != "failed" || !strings.Contains(c.Error, "took the node") {
		t.Fatalf("the held power off after the workflow started: %s (%s)", c.State, c.Error)
	}
	if _, err := h.Metal.Approve(ctx, alice, wf.BatchID, "deploy ok"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Metal.Approve(ctx, alice, held.BatchID, "power ok"); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := eng.Claim(ctx, a, 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got {
		if c.ID == cmdID {
			t.Fatalf("the withdrawn power off went to an agent while workflow %s controls the node", wf.ID)
		}
	}
	evs, err := st.Events(ctx, store.EventFilter{NodeID: node, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs {
		found = found || (e.Kind == "command.withdrawn" && strings.Contains(e.Data, cmdID))
	}
	if !found {
		t.Error("no command.withdrawn event names the power off")
	}
}

// An abort followed at once by a recover into the same state, before the reconciler looked,
// still aborts the workflow: its step's command is cancelled, its cleanup runs, the agent's late
// report moves nothing, and the recover's new workflow starts afresh.
func TestAbortThenRecoverStillAborts(t *testing.T) {
	ctx := context.Background()
	st, h, node, eng, a, _ := byHand(t, engine.Config{AgentGrace: time.Hour})
	if err := h.Apply(ctx, provision.VerbInspect, []string{node}, metal.VerbInput{}); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.RunOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := eng.Claim(ctx, a, 10)
	if err != nil || len(got) == 0 {
		t.Fatalf("claim: %d %v", len(got), err)
	}
	taken := got[0]
	if err := eng.Ack(ctx, a, taken.ID); err != nil {
		t.Fatal(err)
	}
	was := openWorkflow(t, st, node)
	if _, _, err := h.Metal.Apply(ctx, h.Admin, provision.VerbAbort, metal.VerbInput{Node: node, Reason: "stop"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.Metal.Apply(ctx, h.Admin, provision.VerbRecover, metal.VerbInput{Node: node, Reason: "again"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the aborted workflow to end and a new one to start", func() bool {
		if _, err := eng.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		wfs, err := st.Workflows(ctx, node, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, wf := range wfs {
			if wf.ID == was.ID && wf.State != "aborted" {
				return false
			}
		}
		return openWorkflow(t, st, node).ID != was.ID
	})
	if c, _ := st.Command(ctx, taken.ID); c.State != "failed" {
		t.Fatalf("the aborted step's command is %s, want cancelled (failed)", c.State)
	}
	_ = eng.Report(ctx, a, engine.Update{CommandID: taken.ID, State: "succeeded", Result: []byte(`{}`)})
	now := openWorkflow(t, st, node)
	if now.ID == was.ID || now.StepIndex != was.StepIndex || now.CurrentCommand == taken.ID {
		t.Fatalf("after the late report: workflow %s at step %d on %s; the new one should wait at step %d on its own command",
			now.ID, now.StepIndex, now.CurrentCommand, was.StepIndex)
	}
}
