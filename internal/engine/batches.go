package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"bcd/internal/batch"
	"bcd/internal/catalog"
	"bcd/internal/command"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// batchFor is the batch a workflow starting now runs under: the batch parked on the node (a
// bulk batch, or the one-node batch of the chain's first workflow), else a new one-node batch
// whose scope covers what is left of the chain, held until approved. A chain that sends nothing
// destructive needs no batch, and neither does one whose site and pool require no approval now:
// there is nothing to approve. The queue's gate checks a command without a batch against the
// policy as it is when the command is claimed (Engine.gate), and the chain's next workflow looks
// again, so a policy raised meanwhile holds that workflow for approval.
//
// A node whose BMC address is not known yet (accepted --inband: its ramdisk provisions the BMC
// and reports the address) cannot have the rest of its chain's BMC work listed: its batch
// covers the workflow starting now only and is not parked on the node, so that the next
// workflow of the chain, started once the address is known, gets a batch of its own that names
// the BMC.
func (r *run) batchFor(first workflow.Resolved) (string, error) {
	n := &r.n
	if n.BatchID != "" {
		return n.BatchID, nil
	}
	chain := batch.Chain(provision.State(n.State), provision.State(n.TargetState), provision.Verb(n.ChainVerb))
	kinds := first.CommandKinds
	thisOnly := n.BMCAddress == ""
	if thisOnly {
		chain = chain[:min(len(chain), 1)]
	}
	if len(chain) > 1 {
		more, err := r.e.chainKinds(chain[1:], provision.State(n.TargetState), wipeOr(n.WipeMode), n.DeployImage)
		if err != nil {
			return "", err
		}
		kinds = append(append([]string{}, kinds...), more...)
	}
	if !batch.Destructive(kinds) {
		return "", nil
	}
	required, err := r.tx.RequiredApprovals(r.ctx, n.SiteID, n.PoolID)
	if err != nil || required == 0 {
		return "", err
	}
	agents, err := r.tx.SiteAgentIDs(r.ctx, n.SiteID)
	if err != nil {
		return "", err
	}
	leaves, err := batch.Scope([]batch.Target{{NodeID: n.ID, BMCAddress: n.BMCAddress, Kinds: kinds}}, agents)
	if err != nil {
		return "", err
	}
	requester := n.VerbBy
	if requester == "" {
		requester = "reconciler"
	}
	b := store.Batch{TenantID: n.TenantID, SiteID: n.SiteID, PoolID: n.PoolID, Kind: "node", Verb: first.Profile,
		Reason: "workflow " + first.Profile + " of node " + n.Name, RequestedBy: requester, Required: required, Size: 1}
	if slices.Contains(chain, provision.Deploying) && n.DeployImage != "" {
		// What its approvers approve: the image the deploy verb pinned.
		if b.ImageDigest, err = r.tx.DeployImagePin(r.ctx, n.ID); err != nil {
			return "", err
		}
		b.Image = n.DeployImage
	}
	if err := r.tx.InsertBatch(r.ctx, &b, leaves); err != nil {
		return "", err
	}
	if !thisOnly {
		n.BatchID = b.ID
		if err := r.tx.UpdateNode(r.ctx, n); err != nil {
			return "", err
		}
	}
	data := map[string]any{"batch": b.ID, "kind": "node", "state": b.State, "required": required, "leaves": b.Leaves, "profile": first.Profile}
	if b.Image != "" {
		data["image"], data["imageDigest"] = b.Image, b.ImageDigest
	}
	return b.ID, r.event("batch.create", n.State, n.State, "", data)
}

// maxChainKinds bounds the chains whose command kinds an engine keeps.
const maxChainKinds = 1024

// chainKinds is batch.ChainKinds of the rest of a node's chain with its built-in or configured
// profiles (fixed for the engine's life), kept by the chain, target and parameters that alone
// decide it (Engine.chains): each workflow that starts a chain would resolve its profiles
// again in the writer. The slice is shared: read-only.
func (e *Engine) chainKinds(rest []provision.State, target provision.State, wipe, image string) ([]string, error) {
	parts := []string{string(target), wipe, image}
	for _, st := range rest {
		parts = append(parts, string(st))
	}
	key := keptKey(parts...)
	if kinds, ok := e.chains.Get(key); ok {
		return kinds, nil
	}
	kinds, err := batch.ChainKinds(rest, target, batch.BuiltinProfileOf(e.cfg.Profiles), map[string]string{"wipe": wipe, "image": image})
	if err != nil {
		return nil, err
	}
	kinds = slices.Clip(kinds)
	e.chains.Put(key, kinds)
	return kinds, nil
}

func wipeOr(mode string) string {
	if mode == "" {
		return "quick"
	}
	return mode
}

// held reports whether the workflow must wait for its batch before starting a step: pending
// holds it; rejected ends it (the node returns where its verb came from, or fails
// BATCH_REJECTED); approved starts the batch.
func (r *run) held(wf *store.Workflow) (bool, time.Duration, error) {
	hold, err := r.heldNow(wf)
	if err != nil || !hold || wf.OutcomeApplied {
		return hold, 0, err
	}
	// Pending: woken when the batch is decided, and at its approval deadline at the latest.
	b := r.batches[wf.BatchID]
	return true, time.Duration(b.CreatedAt+r.e.cfg.ApprovalTimeout.Microseconds()-r.tx.At()) * time.Microsecond, nil
}

// heldNow is held's decision: pending holds (until the approval deadline, past which the
// batch is rejected by the system), rejected ends the workflow, approved starts the batch.
func (r *run) heldNow(wf *store.Workflow) (bool, error) {
	if wf.BatchID == "" || wf.Phase != "steps" {
		return false, nil
	}
	if _, running := r.e.running.Get(wf.BatchID); running {
		return false, nil
	}
	b, ok := r.batches[wf.BatchID]
	if !ok {
		var err error
		if b, err = r.tx.Batch(r.ctx, wf.BatchID); err != nil {
			return false, err
		}
		if r.batches == nil {
			r.batches = map[string]store.Batch{}
		}
		r.batches[b.ID] = b
	}
	switch b.State {
	case store.BatchRunning:
		// Running is a batch's last state: no later read can find it otherwise.
		r.e.running.Put(b.ID, true)
	case store.BatchPending:
		if r.tx.At() < b.CreatedAt+r.e.cfg.ApprovalTimeout.Microseconds() {
			return true, nil
		}
		if err := r.expireBatch(&b); err != nil {
			return false, err
		}
		r.batches[b.ID] = b
		return true, r.rejected(wf, b)
	case store.BatchRejected:
		return true, r.rejected(wf, b)
	case store.BatchApproved:
		if batch.ApprovedLate(b, batch.Deadline(b, r.e.cfg.ApprovalTimeout)) {
			// Approved after its deadline (by a server whose --approval-timeout is longer):
			// expired, as it would have been had this server looked in time.
			if err := r.expireBatch(&b); err != nil {
				return false, err
			}
			r.batches[b.ID] = b
			return true, r.rejected(wf, b)
		}
		b.State = store.BatchRunning
		r.batches[b.ID] = b
		return false, r.tx.StartBatch(r.ctx, b.ID)
	}
	return false, nil
}

// expireBatch rejects pending batch b, not approved within the approval timeout: every wait has
// a deadline, and nodes do not sit in a workflow-driven state for ever. Its held commands fail
// and its other nodes are woken to end their workflows too.
func (r *run) expireBatch(b *store.Batch) error {
	why := fmt.Sprintf("not approved within %s (bcd server --approval-timeout)", r.e.cfg.ApprovalTimeout)
	b.State, b.DecidedBy, b.DecisionReason, b.DecidedAt = store.BatchRejected, "system", why, r.tx.At()
	if err := r.tx.UpdateBatch(r.ctx, b); err != nil {
		return err
	}
	held, err := r.tx.FailHeldCommands(r.ctx, b.ID, "batch "+b.ID+" "+why)
	if err != nil {
		return err
	}
	for _, c := range held {
		if err := r.tx.AppendEvent(r.ctx, store.Event{TenantID: c.TenantID, NodeID: c.NodeID, Actor: "system", Kind: "command.refused",
			Reason: c.Error, Data: mustData(map[string]any{"command": c.ID, "kind": c.Kind, "batch": b.ID})}); err != nil {
			return err
		}
	}
	nodes, err := r.tx.NodesOfBatch(r.ctx, b.ID)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n != r.n.ID {
			if err := r.tx.Wake(r.ctx, n, "batch expired", 0); err != nil {
				return err
			}
		}
	}
	return r.tx.AppendEvent(r.ctx, store.Event{TenantID: b.TenantID, Actor: "system", Kind: "batch.reject", Reason: why,
		Data: mustData(map[string]any{"batch": b.ID, "expired": true})})
}

// rejected ends a workflow whose batch was rejected before any of its steps ran.
func (r *run) rejected(wf *store.Workflow, b store.Batch) error {
	why := fmt.Sprintf("batch %s was rejected by %s", b.ID, b.DecidedBy)
	if b.DecisionReason != "" {
		why += ": " + b.DecisionReason
	}
	wf.State, wf.FaultCode, wf.Error, wf.FinishedAt, wf.OutcomeApplied = wfAborted, string(provision.FaultBatchRejected), why, r.tx.At(), true
	if err := r.saveWorkflow(wf); err != nil {
		return err
	}
	n := &r.n
	n.BatchID = ""
	back, ok := batch.RejectedReturn(provision.State(n.VerbFrom))
	if !ok {
		if err := r.failNode(provision.FaultBatchRejected, why); err != nil {
			return err
		}
		return r.event("workflow.aborted", n.State, n.State, why, map[string]any{"workflow": wf.ID, "profile": wf.Profile, "batch": b.ID})
	}
	from := n.State
	n.State, n.TargetState, n.ChainVerb = string(back), "", ""
	if err := r.tx.UpdateNode(r.ctx, n); err != nil {
		return err
	}
	return r.event("node.batch.rejected", from, n.State, why, map[string]any{"workflow": wf.ID, "profile": wf.Profile, "batch": b.ID})
}

// gate decides, as the command queue hands a destructive command to agent a, whether its batch
// allows it; a refusal is recorded (the command fails with the reason, an event names it, the
// node is woken to decide).
type gateCache struct {
	batches   map[string]*store.Batch
	approvals map[string]int
	required  map[string]int
	// policies: whether any approvals policy exists (read once per claim); none: no gate.
	policies *bool
}

func (e *Engine) gate(ctx context.Context, tx *store.Tx, a Agent, c *store.Command, gc *gateCache) (bool, error) {
	if !c.Destructive {
		return true, nil
	}
	if gc.policies == nil {
		any, err := tx.AnyApprovalPolicy(ctx)
		if err != nil {
			return false, err
		}
		gc.policies = &any
	}
	if !*gc.policies {
		return true, nil
	}
	var b *store.Batch
	siteID, poolID := c.SiteID, ""
	if c.BatchID != "" {
		if gc.batches[c.BatchID] == nil {
			bb, err := tx.Batch(ctx, c.BatchID)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return false, err
			}
			if err == nil {
				n, err := tx.CountApprovals(ctx, bb.ID)
				if err != nil {
					return false, err
				}
				gc.batches[c.BatchID], gc.approvals[c.BatchID] = &bb, n
			}
		}
		b = gc.batches[c.BatchID]
	}
	if b != nil {
		siteID, poolID = b.SiteID, b.PoolID
	} else {
		var err error
		if siteID, poolID, err = tx.NodePlacement(ctx, c.NodeID); err != nil {
			return false, err
		}
	}
	key := siteID + "/" + poolID
	required, ok := gc.required[key]
	if !ok {
		var err error
		if required, err = tx.RequiredApprovals(ctx, siteID, poolID); err != nil {
			return false, err
		}
		gc.required[key] = required
	}
	if required == 0 {
		return true, nil
	}
	subject := batch.AgentSubject(c.Subject, a.ID)
	inScope := false
	if b != nil {
		var err error
		if inScope, err = tx.LeafInScope(ctx, b.ID, subject, c.Kind); err != nil {
			return false, err
		}
	}
	var deadline int64
	if b != nil {
		deadline = batch.Deadline(*b, e.cfg.ApprovalTimeout)
	}
	gerr := batch.Gate(required, b, gc.approvals[c.BatchID], inScope, subject, c.Kind, deadline)
	if gerr == nil {
		if b != nil && b.State == store.BatchApproved {
			// The batch's first command goes out: it runs from now on (no withdrawal or
			// rejection of work already sent). A workflow's batch started at its first step.
			if err := tx.StartBatch(ctx, b.ID); err != nil {
				return false, err
			}
			b.State = store.BatchRunning
		}
		return true, nil
	}
	c.State, c.Error, c.FinishedAt, c.TargetAgent = string(command.Failed), gerr.Error(), tx.At(), a.ID
	if err := tx.UpdateCommand(ctx, c); err != nil {
		return false, err
	}
	data, _ := json.Marshal(map[string]any{"command": c.ID, "kind": c.Kind, "subject": subject, "batch": c.BatchID, "agent": a.ID})
	if err := tx.AppendEvent(ctx, store.Event{TenantID: c.TenantID, NodeID: c.NodeID, Actor: "queue", Kind: "command.refused",
		Reason: gerr.Error(), Data: string(data)}); err != nil {
		return false, err
	}
	e.log.Warn("destructive command refused", "command", c.ID, "kind", c.Kind, "subject", subject, "why", gerr.Error())
	return false, tx.Wake(ctx, c.NodeID, "command refused", 0)
}

// unpark takes the batch off a node that rests. A batch still pending whose last node left it
// (aborted before approval) is cancelled, so no approver approves work nothing waits for.
func (r *run) unpark() error {
	id := r.n.BatchID
	r.n.BatchID = ""
	if err := r.tx.UpdateNode(r.ctx, &r.n); err != nil {
		return err
	}
	cancelled, err := r.tx.CancelDeserted(r.ctx, id)
	if err != nil || !cancelled {
		return err
	}
	return r.event("batch.cancelled", r.n.State, r.n.State, "every node left the batch before it was approved", map[string]any{"batch": id})
}

// checkImagePin refuses img, about to be written (deploy.image) or inserted (bmc.media) by the
// node's deploy, when the catalog replaced it since the deploy verb pinned its digest: what was
// asked (and approved) is what is written, or nothing is.
func (r *run) checkImagePin(img catalog.Image) error {
	if r.n.State != string(provision.Deploying) || img.Name != r.n.DeployImage {
		return nil
	}
	pinned, err := r.tx.DeployImagePin(r.ctx, r.n.ID)
	if err != nil {
		return err
	}
	return batch.CheckPin(pinned, img)
}

// ExpireBatches rejects, as the system, the pending batches past their approval deadline that
// no workflow will look at (a one-command batch holding an operator's power action or a BMC
// credential rotation; a batch whose every workflow ended before it was decided): their held
// commands fail with the reason, each is recorded (batch.reject by system, command.refused),
// and the nodes of those commands are woken (a rotation's node records it failed). Sweep
// calls it; it returns how many it expired. The batches workflows wait on expire with them
// (heldNow).
func (e *Engine) ExpireBatches(ctx context.Context) (int, error) {
	var expired int
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		expired = 0
		list, err := tx.UnwatchedPendingBatches(ctx, tx.At()-e.cfg.ApprovalTimeout.Microseconds(), 500)
		if err != nil {
			return err
		}
		for _, b := range list {
			if err := expireUnwatched(ctx, tx, &b, e.cfg.ApprovalTimeout); err != nil {
				return err
			}
			expired++
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("expiring unapproved batches: %w", err)
	}
	if expired > 0 {
		e.log.Info("expired unapproved batches", "count", expired, "approval_timeout", e.cfg.ApprovalTimeout)
		e.Nudge()
	}
	return expired, nil
}

// expireUnwatched rejects pending batch b as expired (ExpireBatches).
func expireUnwatched(ctx context.Context, tx *store.Tx, b *store.Batch, timeout time.Duration) error {
	why := fmt.Sprintf("not approved within %s (bcd server --approval-timeout)", timeout)
	b.State, b.DecidedBy, b.DecisionReason, b.DecidedAt = store.BatchRejected, "system", why, tx.At()
	if err := tx.UpdateBatch(ctx, b); err != nil {
		return err
	}
	held, err := tx.FailHeldCommands(ctx, b.ID, fmt.Sprintf("batch %s expired at %s: %s", b.ID, batch.Stamp(batch.Deadline(*b, timeout)), why))
	if err != nil {
		return err
	}
	evs := make([]store.Event, 0, len(held)+1)
	var woken []string
	for _, c := range held {
		evs = append(evs, store.Event{TenantID: c.TenantID, NodeID: c.NodeID, Actor: "system", Kind: "command.refused",
			Reason: c.Error, Data: mustData(map[string]any{"command": c.ID, "kind": c.Kind, "batch": b.ID})})
		if !slices.Contains(woken, c.NodeID) {
			woken = append(woken, c.NodeID)
		}
	}
	evs = append(evs, store.Event{TenantID: b.TenantID, Actor: "system", Kind: "batch.reject", Reason: why,
		Data: mustData(map[string]any{"batch": b.ID, "expired": true, "verb": b.Verb})})
	if err := tx.AppendEvents(ctx, evs); err != nil {
		return err
	}
	return tx.WakeMany(ctx, woken, "batch expired")
}
