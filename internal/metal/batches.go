package metal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"bcd/internal/auth"
	"bcd/internal/batch"
	"bcd/internal/catalog"
	"bcd/internal/command"
	"bcd/internal/hardware"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// ---------------------------------------------------------------- approvals policy

// ApprovalScopes are what an approvals policy may apply to.
var ApprovalScopes = []string{"installation", "site", "pool"}

// MaxRequiredApprovals bounds a policy.
const MaxRequiredApprovals = 10

// SetApprovalPolicy makes destructive commands in a scope (the installation, a site or a pool)
// require n approvals; 0 removes the scope's policy. A node needs the largest of its
// installation's, site's and pool's.
func (s *Service) SetApprovalPolicy(ctx context.Context, p auth.Principal, scope, ref string, n int) (store.ApprovalPolicy, error) {
	if err := Require(p, auth.Administer); err != nil {
		return store.ApprovalPolicy{}, err
	}
	if p.TenantID != "" && scope == "installation" {
		return store.ApprovalPolicy{}, &ForbiddenError{Msg: "a tenant's token cannot set the installation's approvals policy"}
	}
	if n < 0 || n > MaxRequiredApprovals {
		return store.ApprovalPolicy{}, invalid("required", "%d is out of range: accepted are 0-%d", n, MaxRequiredApprovals)
	}
	var key, tenantID string
	switch scope {
	case "installation":
		key = store.ApprovalScope(scope, "")
	case "site":
		if ref == "" {
			return store.ApprovalPolicy{}, invalid("ref", "is required for scope site: the name or id of the site")
		}
		site, err := s.st.Site(ctx, ref)
		if err != nil || !p.CanSeeTenant(site.TenantID) {
			return store.ApprovalPolicy{}, fmt.Errorf("site %q: %w", ref, store.ErrNotFound)
		}
		key, tenantID = store.ApprovalScope(scope, site.ID), site.TenantID
	case "pool":
		if ref == "" {
			return store.ApprovalPolicy{}, invalid("ref", "is required for scope pool: the name or id of the pool")
		}
		pool, err := s.st.Pool(ctx, ref)
		if err != nil || !p.CanSeeTenant(pool.TenantID) {
			return store.ApprovalPolicy{}, fmt.Errorf("pool %q: %w", ref, store.ErrNotFound)
		}
		key, tenantID = store.ApprovalScope(scope, pool.ID), pool.TenantID
	default:
		return store.ApprovalPolicy{}, invalid("scope", "unknown scope %q: accepted are %s", truncate(scope), strings.Join(ApprovalScopes, ", "))
	}
	err := s.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.SetApprovalPolicy(ctx, key, n, p.Actor()); err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: tenantID, Actor: p.Actor(), Kind: "approvals.policy",
			Data: jsonObject(map[string]any{"scope": key, "ref": ref, "required": n})})
	})
	if err != nil {
		return store.ApprovalPolicy{}, err
	}
	return store.ApprovalPolicy{Scope: key, Required: n, UpdatedBy: p.Actor()}, nil
}

// ApprovalPolicies lists the approvals policies p may see: every one for a token without a
// tenant; the installation's and those of its own sites and pools for a tenant's.
func (s *Service) ApprovalPolicies(ctx context.Context, p auth.Principal) ([]store.ApprovalPolicy, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	all, err := s.st.ApprovalPolicies(ctx)
	if err != nil || p.TenantID == "" {
		return all, err
	}
	sites, err := s.st.Sites(ctx, p.TenantID)
	if err != nil {
		return nil, err
	}
	pools, err := s.st.Pools(ctx, p.TenantID, "")
	if err != nil {
		return nil, err
	}
	own := map[string]bool{store.ApprovalScope("installation", ""): true}
	for _, st := range sites {
		own[store.ApprovalScope("site", st.ID)] = true
	}
	for _, pl := range pools {
		own[store.ApprovalScope("pool", pl.ID)] = true
	}
	var out []store.ApprovalPolicy
	for _, pol := range all {
		if own[pol.Scope] {
			out = append(out, pol)
		}
	}
	return out, nil
}

// ---------------------------------------------------------------- batches

// Batches lists batches visible to p, newest first (state filters: pending, approved, running,
// rejected).
func (s *Service) Batches(ctx context.Context, p auth.Principal, state string, limit int) ([]store.Batch, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	if state != "" && !slices.Contains([]string{store.BatchPending, store.BatchApproved, store.BatchRunning, store.BatchRejected, store.BatchCancelled}, state) {
		return nil, invalid("state", "unknown batch state %q: accepted are pending, approved, running, rejected, cancelled", truncate(state))
	}
	if limit < 0 || limit > MaxPageSize {
		return nil, invalid("limit", "%d is out of range: accepted are 1-%d (0 for the default of 100)", limit, MaxPageSize)
	}
	return s.st.Batches(ctx, store.BatchFilter{TenantID: p.TenantID, State: state, Limit: limit})
}

// PendingBatches lists the batches waiting for approval, oldest first (doctor).
func (s *Service) PendingBatches(ctx context.Context, p auth.Principal, limit int) ([]store.Batch, error) {
	list, err := s.Batches(ctx, p, store.BatchPending, limit)
	slices.Reverse(list)
	return list, err
}

// Batch reads a batch and up to leafLimit of its leaves.
func (s *Service) Batch(ctx context.Context, p auth.Principal, id string, leafLimit int) (store.Batch, []store.Leaf, error) {
	if err := Require(p, auth.Read); err != nil {
		return store.Batch{}, nil, err
	}
	if id == "" {
		return store.Batch{}, nil, invalid("batch", "is required: a batch id (bcd batch list)")
	}
	b, err := s.st.Batch(ctx, id)
	if err != nil || !p.CanSeeTenant(b.TenantID) {
		return store.Batch{}, nil, fmt.Errorf("batch %q: %w", truncate(id), store.ErrNotFound)
	}
	if leafLimit <= 0 {
		leafLimit = 1000
	}
	leaves, err := s.st.BatchLeaves(ctx, id, min(leafLimit, 100000))
	return b, leaves, err
}

// BatchFailures lists the batch's nodes whose workflow under it failed or was aborted
// (store.Store.BatchFailures), the first to end first, as p may see the batch.
func (s *Service) BatchFailures(ctx context.Context, p auth.Principal, id string) ([]store.BatchFailure, error) {
	if _, _, err := s.Batch(ctx, p, id, 1); err != nil {
		return nil, err
	}
	return s.st.BatchFailures(ctx, id)
}

// FailureCounts counts a batch's failures (BatchFailures) by how their workflow ended: failed,
// or aborted (a rejection aborts those waiting). Pure.
func FailureCounts(fails []store.BatchFailure) (failed, aborted int) {
	for _, f := range fails {
		if f.State == "aborted" {
			aborted++
		} else {
			failed++
		}
	}
	return failed, aborted
}

// decide runs f on a batch inside one transaction and wakes the batch's nodes after.
func (s *Service) decide(ctx context.Context, p auth.Principal, id string, f func(tx *store.Tx, b *store.Batch) (wake bool, err error)) (store.Batch, error) {
	if id == "" {
		return store.Batch{}, invalid("batch", "is required: a batch id (bcd batch list)")
	}
	var out store.Batch
	err := s.st.Write(ctx, func(tx *store.Tx) error {
		b, err := tx.Batch(ctx, id)
		if err != nil || !p.CanSeeTenant(b.TenantID) {
			return fmt.Errorf("batch %q: %w", truncate(id), store.ErrNotFound)
		}
		wake, err := f(tx, &b)
		if err != nil {
			return err
		}
		if wake {
			nodes, err := tx.NodesOfBatch(ctx, b.ID)
			if err != nil {
				return err
			}
			if err := tx.WakeMany(ctx, nodes, "batch "+b.State); err != nil {
				return err
			}
		}
		out = b
		return nil
	})
	if err != nil {
		return store.Batch{}, decisionError(err)
	}
	s.woke()
	return s.st.Batch(ctx, out.ID)
}

// raisePolicy applies to b a policy raised while it waited: the gate counts approvals against
// the policy as it is when the work is sent. It reports whether it was raised.
func raisePolicy(ctx context.Context, tx *store.Tx, b *store.Batch) (bool, error) {
	now, err := tx.RequiredApprovals(ctx, b.SiteID, b.PoolID)
	if err != nil {
		return false, err
	}
	if now <= b.Required {
		return false, nil
	}
	b.Required = now
	return true, nil
}

func decisionError(err error) error {
	var de *batch.DecisionError
	var se *batch.SelfApprovalError
	switch {
	case errors.As(err, &se):
		return &ForbiddenError{Msg: se.Msg}
	case errors.As(err, &de):
		return &ConflictError{Msg: de.Msg}
	}
	return err
}

// ConflictError is a request the object's current state refuses (a batch already started).
type ConflictError struct{ Msg string }

func (e *ConflictError) Error() string { return e.Msg }

// Approve records p's approval of a batch. A requester cannot approve their own batch; the
// quorum reached, the batch is approved and its nodes (and held commands) go.
func (s *Service) Approve(ctx context.Context, p auth.Principal, id, reason string) (store.Batch, error) {
	if err := Require(p, auth.Approve); err != nil {
		return store.Batch{}, err
	}
	if err := ValidReason(reason); err != nil {
		return store.Batch{}, err
	}
	b, err := s.decide(ctx, p, id, func(tx *store.Tx, b *store.Batch) (bool, error) {
		n, err := tx.CountApprovals(ctx, b.ID)
		if err != nil {
			return false, err
		}
		already, err := tx.HasApproval(ctx, b.ID, p.Actor())
		if err != nil {
			return false, err
		}
		raised, err := raisePolicy(ctx, tx, b)
		if err != nil {
			return false, err
		}
		next, err := batch.Approve(*b, p.Actor(), n, already, tx.At(), batch.Deadline(*b, s.approvalTimeout))
		if err != nil {
			return false, err
		}
		if err := tx.AddApproval(ctx, b.ID, p.Actor()); err != nil {
			return false, err
		}
		opened := next == store.BatchApproved && b.State == store.BatchPending
		if opened {
			b.State, b.DecidedBy, b.DecidedAt = store.BatchApproved, p.Actor(), tx.At()
		}
		if opened || raised {
			if err := tx.UpdateBatch(ctx, b); err != nil {
				return false, err
			}
		}
		if opened {
			if err := tx.ReleaseHeldCommands(ctx, b.ID); err != nil {
				return false, err
			}
		}
		return opened, tx.AppendEvent(ctx, store.Event{TenantID: b.TenantID, Actor: p.Actor(), Kind: "batch.approve", Reason: reason,
			Data: jsonObject(map[string]any{"batch": b.ID, "approvals": n + 1, "required": b.Required, "state": b.State})})
	})
	if err == nil {
		s.log.LogAttrs(ctx, slog.LevelInfo, "batch approved", slog.String("batch", b.ID), slog.String("state", b.State), slog.String("actor", p.Actor()))
	}
	return b, err
}

// Withdraw withdraws p's approval of a batch that has not started; below the quorum (the
// policy's now, if it was raised) it is held again, and so are the commands its approval had
// released that no agent took yet (an operator's power action, a rotation): they wait for the
// batch as before, rather than being refused when an agent asks for them.
func (s *Service) Withdraw(ctx context.Context, p auth.Principal, id, reason string) (store.Batch, error) {
	if err := Require(p, auth.Approve); err != nil {
		return store.Batch{}, err
	}
	if err := ValidReason(reason); err != nil {
		return store.Batch{}, err
	}
	return s.decide(ctx, p, id, func(tx *store.Tx, b *store.Batch) (bool, error) {
		if b.State == store.BatchRunning || b.State == store.BatchRejected || b.State == store.BatchCancelled {
			_, err := batch.Withdraw(*b, true, 0)
			return false, err
		}
		had, err := tx.RemoveApproval(ctx, b.ID, p.Actor())
		if err != nil {
			return false, err
		}
		n, err := tx.CountApprovals(ctx, b.ID)
		if err != nil {
			return false, err
		}
		raised, err := raisePolicy(ctx, tx, b) // as in Approve
		if err != nil {
			return false, err
		}
		next, err := batch.Withdraw(*b, had, n)
		if err != nil {
			return false, err
		}
		rehold, changed := batch.Rehold(b.State, next), next != b.State
		if changed {
			b.State, b.DecidedBy, b.DecidedAt = next, "", 0
		}
		if changed || raised {
			if err := tx.UpdateBatch(ctx, b); err != nil {
				return false, err
			}
		}
		data := map[string]any{"batch": b.ID, "approvals": n, "required": b.Required, "state": b.State}
		if rehold {
			held, err := tx.HoldQueuedCommands(ctx, b.ID)
			if err != nil {
				return false, err
			}
			data["heldAgain"] = held
		}
		return false, tx.AppendEvent(ctx, store.Event{TenantID: b.TenantID, Actor: p.Actor(), Kind: "batch.withdraw", Reason: reason,
			Data: jsonObject(data)})
	})
}

// Reject refuses a batch that has not started: its held workflows end without running a step
// (each node returns to the state its verb came from, or fails BATCH_REJECTED when it has none
// to return to) and its held commands fail. Approvers and the batch's requester may reject.
func (s *Service) Reject(ctx context.Context, p auth.Principal, id, reason string) (store.Batch, error) {
	if err := Require(p, auth.Read); err != nil {
		return store.Batch{}, err
	}
	if err := ValidReason(reason); err != nil {
		return store.Batch{}, err
	}
	return s.decide(ctx, p, id, func(tx *store.Tx, b *store.Batch) (bool, error) {
		if !auth.Allows(p.Role, auth.Approve) && b.RequestedBy != p.Actor() {
			return false, &ForbiddenError{Msg: fmt.Sprintf("token %q has role %s: only approvers and the requester (%s) may reject batch %s", p.Name, p.Role, b.RequestedBy, b.ID)}
		}
		if err := batch.Reject(*b); err != nil {
			return false, err
		}
		b.State, b.DecidedBy, b.DecisionReason, b.DecidedAt = store.BatchRejected, p.Actor(), reason, tx.At()
		if err := tx.UpdateBatch(ctx, b); err != nil {
			return false, err
		}
		held, err := tx.FailHeldCommands(ctx, b.ID, "batch "+b.ID+" rejected by "+p.Actor())
		if err != nil {
			return false, err
		}
		for _, c := range held {
			if err := tx.AppendEvent(ctx, store.Event{TenantID: c.TenantID, NodeID: c.NodeID, Actor: p.Actor(), Kind: "command.refused",
				Reason: c.Error, Data: jsonObject(map[string]any{"command": c.ID, "kind": c.Kind, "batch": b.ID})}); err != nil {
				return false, err
			}
		}
		return true, tx.AppendEvent(ctx, store.Event{TenantID: b.TenantID, Actor: p.Actor(), Kind: "batch.reject", Reason: reason,
			Data: jsonObject(map[string]any{"batch": b.ID})})
	})
}

// directBatch puts a command the API sends directly (metal.power, BMC credential rotation)
// under a one-node batch when approvals are required: the command is held until the batch is
// approved. It returns the batch id ("" when none is needed).
func (s *Service) directBatch(ctx context.Context, tx *store.Tx, p auth.Principal, n store.Node, c *store.Command, reason string) (string, error) {
	k, err := command.Lookup(c.Kind)
	if err != nil || !k.Destructive {
		return "", err
	}
	required, err := tx.RequiredApprovals(ctx, n.SiteID, n.PoolID)
	if err != nil || required == 0 {
		return "", err
	}
	agents, err := tx.SiteAgentIDs(ctx, n.SiteID)
	if err != nil {
		return "", err
	}
	leaves, err := batch.Scope([]batch.Target{{NodeID: n.ID, BMCAddress: n.BMCAddress, Kinds: []string{c.Kind}}}, agents)
	if err != nil {
		return "", err
	}
	b := store.Batch{TenantID: n.TenantID, SiteID: n.SiteID, PoolID: n.PoolID, Kind: "node", Verb: c.Kind, Reason: reason,
		RequestedBy: p.Actor(), Required: required, Size: 1}
	if err := tx.InsertBatch(ctx, &b, leaves); err != nil {
		return "", err
	}
	c.BatchID, c.State = b.ID, "held"
	return b.ID, tx.AppendEvent(ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: p.Actor(), Kind: "batch.create", Reason: reason,
		Data: jsonObject(map[string]any{"batch": b.ID, "kind": "node", "state": b.State, "required": required, "leaves": b.Leaves, "command": c.Kind})})
}

// ---------------------------------------------------------------- bulk

// BulkInput is metal.bulk's input: one verb on up to 10,000 nodes of one pool, named by id or
// name, or selected by labels (key=value, all must match). A deploy names its image (and
// profile, user-data); with Count it takes that many of the pool's nodes that can deploy
// (matching the selectors, if any), all or none: first by name, or, with Spread (a label key),
// in turn from each of that label's values (spreadPick). Require (hardware requirements, as
// "memory>=256GiB") narrows what count or selectors choose to the nodes whose inventory meets
// every one; a node that never reported an inventory meets none.
type BulkInput struct {
	Pool      string
	Verb      string
	Nodes     []string
	Selectors []string
	Require   []string
	Wipe      string
	Reason    string
	// Deploy only.
	Image, Profile string
	UserData       []byte
	Count          int
	Spread         string
}

// BulkNode is one node's answer.
type BulkNode struct {
	Node, Name string
	Accepted   bool
	Error      string
	State      string
}

// BulkResult is metal.bulk's answer. SpreadTaken, with BulkInput.Spread, counts the nodes taken
// by the label's value ("(none)": without it).
type BulkResult struct {
	Batch       store.Batch
	Held        bool
	Nodes       []BulkNode
	SpreadTaken map[string]int
}

// spreadPick takes count of nodes (fewer if there are fewer): with key "", the first by name;
// else in turn from each value of label key, the values in order and the nodes without the
// label (or with it empty) last, each value's nodes by name, so that the count spreads as
// evenly as the nodes allow over racks, rows or power feeds (a value that runs out drops out
// of the turn). The nodes are returned in the order taken. Pure.
func spreadPick(nodes []store.Node, key string, count int) []store.Node {
	byName := func(a, b store.Node) int { return strings.Compare(a.Name, b.Name) }
	if key == "" {
		sorted := slices.SortedFunc(slices.Values(nodes), byName)
		return sorted[:min(count, len(sorted))]
	}
	if len(nodes) == 0 {
		return nil
	}
	groups := map[string][]store.Node{}
	for _, n := range nodes {
		groups[n.Labels[key]] = append(groups[n.Labels[key]], n)
	}
	values := slices.Sorted(maps.Keys(groups))
	if values[0] == "" && len(values) > 1 { // (nodes without the label: last)
		values = append(values[1:], "")
	}
	for _, v := range values {
		slices.SortFunc(groups[v], byName)
	}
	out := make([]store.Node, 0, min(count, len(nodes)))
	for len(out) < count && len(out) < len(nodes) {
		for _, v := range values {
			if g := groups[v]; len(g) > 0 && len(out) < count {
				out, groups[v] = append(out, g[0]), g[1:]
			}
		}
	}
	return out
}

// spreadCounts counts nodes by the value of their label key, "(none)" for those without it
// (a label value has no parentheses). Pure.
func spreadCounts(nodes []store.Node, key string) map[string]int {
	out := map[string]int{}
	for _, n := range nodes {
		v := n.Labels[key]
		if v == "" {
			v = "(none)"
		}
		out[v]++
	}
	return out
}

// Bulk applies a verb to many nodes of one pool as one batch: each node's move is decided as its
// own verb call; the accepted ones move in one transaction, with the batch (its scope covering
// the verb's whole chain of workflows) parked on them until each rests. Where approvals are
// required their workflows are held until the batch is approved.
func (s *Service) Bulk(ctx context.Context, p auth.Principal, in BulkInput) (BulkResult, error) {
	if err := Require(p, auth.Operate); err != nil {
		return BulkResult{}, err
	}
	v := provision.Verb(in.Verb)
	if !slices.Contains(batch.BulkVerbs, v) {
		names := make([]string, len(batch.BulkVerbs))
		for i, b := range batch.BulkVerbs {
			names[i] = string(b)
		}
		return BulkResult{}, invalid("verb", "%q cannot be applied in bulk: accepted are %s", truncate(in.Verb), strings.Join(names, ", "))
	}
	if in.Pool == "" {
		return BulkResult{}, invalid("pool", "is required: the name or id of the pool whose nodes the verb applies to")
	}
	if err := ValidReason(in.Reason); err != nil {
		return BulkResult{}, err
	}
	if strings.TrimSpace(in.Reason) == "" {
		return BulkResult{}, invalid("reason", "is required for a bulk operation: approvers read it")
	}
	deploy := v == provision.VerbDeploy
	switch {
	case !deploy && (in.Image != "" || in.Profile != "" || len(in.UserData) > 0 || in.Count != 0):
		return BulkResult{}, invalid(firstSet(map[string]bool{"image": in.Image != "", "profile": in.Profile != "", "userData": len(in.UserData) > 0, "count": in.Count != 0}),
			"applies to deploy only")
	case in.Count < 0 || in.Count > batch.MaxBulk:
		return BulkResult{}, invalid("count", "%d: from 1 to %d nodes are taken in one bulk deploy", in.Count, batch.MaxBulk)
	case in.Count > 0 && len(in.Nodes) > 0:
		return BulkResult{}, invalid("nodes", "count takes nodes from the pool by itself: give label selectors or nothing, not node names")
	case in.Count == 0 && (len(in.Nodes) == 0) == (len(in.Selectors) == 0):
		return BulkResult{}, invalid("nodes", "give either node names or ids, or label selectors (not both)")
	case in.Spread != "" && in.Count == 0:
		return BulkResult{}, invalid("spread", "applies with count only: it chooses which of the pool's nodes a count takes")
	case in.Spread != "" && !labelKeyRe.MatchString(in.Spread):
		return BulkResult{}, invalid("spread", "label key %q is not valid: use 1-63 characters of a-z, 0-9, '.', '_', '/' and '-'", truncate(in.Spread))
	case len(in.Require) > 0 && len(in.Nodes) > 0:
		return BulkResult{}, invalid("require", "narrows what count or selectors choose: give it with them, not with node names")
	}
	reqs, err := hardware.ParseAll(in.Require)
	if err != nil {
		return BulkResult{}, invalid("require", "%s", err)
	}
	if deploy {
		if err := s.checkDeploy(ctx, &in.Profile, in.Image, in.UserData); err != nil {
			return BulkResult{}, err
		}
	}
	if len(in.Nodes) > batch.MaxBulk {
		return BulkResult{}, invalid("nodes", "%d nodes: at most %d are accepted in one bulk", len(in.Nodes), batch.MaxBulk)
	}
	if v == provision.VerbUndeploy {
		if in.Wipe == "" {
			in.Wipe = "quick"
		}
		if !slices.Contains(WipeModes, in.Wipe) {
			return BulkResult{}, invalid("wipe", "unknown wipe mode %q: accepted are %s", truncate(in.Wipe), strings.Join(WipeModes, ", "))
		}
	} else if in.Wipe != "" {
		return BulkResult{}, invalid("wipe", "applies to undeploy only")
	}
	labels, err := ParseSelectors("selectors", in.Selectors)
	if err != nil {
		return BulkResult{}, err
	}
	pool, err := s.st.Pool(ctx, in.Pool)
	if err != nil || !p.CanSeeTenant(pool.TenantID) {
		return BulkResult{}, fmt.Errorf("pool %q: %w", truncate(in.Pool), store.ErrNotFound)
	}
	// The pool's nodes, read once: names and ids resolve against them.
	all, err := s.st.Nodes(ctx, store.NodeFilter{PoolID: pool.ID, Labels: labels, Limit: 1000000})
	if err != nil {
		return BulkResult{}, err
	}
	var picked []BulkNode
	var rows []store.Node
	if in.Count > 0 {
		// The pool's nodes (matching the selectors) that can deploy now: the first Count by
		// name, or spread over a label's values; or none.
		var can []store.Node
		for _, n := range all {
			if _, err := provision.Decide(PNode(n), v); err == nil {
				can = append(can, n)
			}
		}
		uninspected := 0
		if can, uninspected, err = s.meeting(ctx, can, reqs); err != nil {
			return BulkResult{}, err
		}
		rows = spreadPick(can, in.Spread, in.Count)
		for _, n := range rows {
			picked = append(picked, BulkNode{Node: n.ID, Name: n.Name})
		}
		if len(rows) < in.Count {
			return BulkResult{}, &ConflictError{Msg: fmt.Sprintf("pool %s has %d nodes that can deploy now%s (ready, out of maintenance): %d were asked for; nothing was deployed%s",
				pool.Name, len(rows), selectedBy(append(slices.Clone(in.Selectors), in.Require...)), in.Count, uninspectedNote(uninspected))}
		}
	} else if len(labels) > 0 {
		if all, _, err = s.meeting(ctx, all, reqs); err != nil {
			return BulkResult{}, err
		}
		if len(all) > batch.MaxBulk {
			return BulkResult{}, invalid("selector", "selects %d nodes: at most %d are accepted in one bulk", len(all), batch.MaxBulk)
		}
		for _, n := range all {
			picked = append(picked, BulkNode{Node: n.ID, Name: n.Name})
			rows = append(rows, n)
		}
	} else {
		byRef := make(map[string]int, 2*len(all))
		for i, n := range all {
			byRef[n.ID], byRef[n.Name] = i, i
		}
		seen := map[string]bool{}
		for _, ref := range in.Nodes {
			i, ok := byRef[ref]
			if !ok {
				picked = append(picked, BulkNode{Node: truncate(ref), Error: "no such node in pool " + pool.Name})
				rows = append(rows, store.Node{})
				continue
			}
			n := all[i]
			if seen[n.ID] {
				picked = append(picked, BulkNode{Node: n.ID, Name: n.Name, Error: "listed twice"})
				rows = append(rows, store.Node{})
				continue
			}
			seen[n.ID] = true
			picked = append(picked, BulkNode{Node: n.ID, Name: n.Name})
			rows = append(rows, n)
		}
	}
	// Each node's move, decided as its own verb call would.
	moves := make([]provision.Move, len(rows))
	accepted := 0
	for i := range rows {
		if picked[i].Error != "" {
			continue
		}
		m, err := provision.Decide(PNode(rows[i]), v)
		if err != nil {
			picked[i].Error = err.Error()
			continue
		}
		moves[i] = m
		picked[i].Accepted = true
		accepted++
	}
	res := BulkResult{Nodes: picked}
	if in.Spread != "" {
		res.SpreadTaken = spreadCounts(rows, in.Spread)
	}
	if accepted == 0 {
		return res, nil
	}
	var b store.Batch
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		required, err := tx.RequiredApprovals(ctx, pool.SiteID, pool.ID)
		if err != nil {
			return err
		}
		agents, err := tx.SiteAgentIDs(ctx, pool.SiteID)
		if err != nil {
			return err
		}
		// The scope: every node's chain of workflows (the same for nodes moving alike).
		kindsOf := map[[2]provision.State][]string{}
		var targets []batch.Target
		params := map[string]string{"wipe": in.Wipe, "image": "-"}
		if params["wipe"] == "" {
			params["wipe"] = "quick"
		}
		profileOf := batch.BuiltinProfileOf(s.profiles)
		var pinned string
		if deploy {
			// The scope covers the deploy profile's commands; the batch names the image its
			// approvers approve, pinned as the catalog holds it now (as the deploy verb pins it).
			dp, err := s.deployProfile(ctx, tx, in.Profile)
			if err != nil {
				return err
			}
			profileOf = deployProfileOf(dp, profileOf)
			params["image"] = in.Image
			now, err := tx.VerifiedImage(ctx, in.Image)
			if err != nil {
				return invalid("image", "%s: deploy writes only catalog images whose signature verifies", err.Error())
			}
			pinned = batch.ImageDigest(now)
			if len(in.UserData) > 0 {
				guest, err := s.deployGuest(ctx, tx, in.Profile)
				if err != nil {
					return err
				}
				if err := CheckUserData(guest, in.UserData); err != nil {
					return fmt.Errorf("deploy profile %s: %w", in.Profile, err)
				}
			}
		}
		for i := range rows {
			if !picked[i].Accepted || !moves[i].Wakes {
				continue
			}
			key := [2]provision.State{moves[i].To, moves[i].Target}
			kinds, ok := kindsOf[key]
			if !ok {
				chain := batch.Chain(moves[i].To, moves[i].Target, v)
				if kinds, err = batch.ChainKinds(chain, moves[i].Target, profileOf, params); err != nil {
					return err
				}
				kindsOf[key] = kinds
			}
			targets = append(targets, batch.Target{NodeID: rows[i].ID, BMCAddress: rows[i].BMCAddress, Kinds: kinds})
		}
		leaves, err := batch.Scope(targets, agents)
		if err != nil {
			return err
		}
		b = store.Batch{TenantID: pool.TenantID, SiteID: pool.SiteID, PoolID: pool.ID, Kind: "bulk", Verb: string(v), Reason: in.Reason,
			RequestedBy: p.Actor(), Required: required, Size: accepted}
		if deploy {
			b.Image, b.ImageDigest = in.Image, pinned
		}
		if len(leaves) == 0 {
			b.Required = 0 // nothing destructive: nothing to approve
		}
		if err := tx.InsertBatch(ctx, &b, leaves); err != nil {
			return err
		}
		ev := make([]store.Event, 0, accepted+1)
		created := map[string]any{"batch": b.ID, "kind": "bulk", "verb": v, "pool": pool.Name, "size": accepted, "state": b.State, "required": b.Required, "leaves": b.Leaves}
		if deploy {
			created["image"], created["imageDigest"], created["profile"] = in.Image, pinned, in.Profile
			if in.Count > 0 {
				created["count"] = in.Count
			}
			if in.Spread != "" {
				created["spread"] = map[string]any{"label": in.Spread, "taken": res.SpreadTaken}
			}
		}
		if len(reqs) > 0 {
			created["require"] = requirementStrings(reqs)
		}
		ev = append(ev, store.Event{TenantID: pool.TenantID, Actor: p.Actor(), Kind: "batch.create", Reason: in.Reason, Data: jsonObject(created)})
		// Nodes read in the same state move alike: one statement per 500 of them, conditioned on
		// the state the decision was taken on (a node that changed meanwhile is refused).
		type group struct {
			m   store.BulkMove
			idx []int
		}
		groups := map[[3]string]*group{}
		var order [][3]string
		for i := range rows {
			if !picked[i].Accepted {
				continue
			}
			n := rows[i]
			key := [3]string{n.State, n.TargetState, fmt.Sprint(n.Maintenance)}
			g := groups[key]
			if g == nil {
				after := n
				applyMove(&after, v, moves[i])
				g = &group{m: store.BulkMove{FromState: n.State, FromTarget: n.TargetState, FromMaintenance: n.Maintenance,
					State: after.State, TargetState: after.TargetState, ChainVerb: after.ChainVerb, SetChain: after.ChainVerb != n.ChainVerb,
					VerbFrom: n.State, VerbBy: p.Actor(), BatchID: b.ID, SetVerb: moves[i].Wakes, SetBatch: moves[i].Wakes,
					WipeMode: in.Wipe, SetWipeMode: v == provision.VerbUndeploy,
					DeployProfile: in.Profile, DeployImage: in.Image, SetDeploy: deploy}}
				groups[key] = g
				order = append(order, key)
			}
			g.idx = append(g.idx, i)
		}
		var wake []string
		nodeData := map[string]any{"batch": b.ID}
		if deploy {
			nodeData["profile"], nodeData["image"], nodeData["imageDigest"] = in.Profile, in.Image, pinned
			if len(in.UserData) > 0 {
				sum := sha256.Sum256(in.UserData)
				nodeData["userDataSize"], nodeData["userDataSha256"] = len(in.UserData), hex.EncodeToString(sum[:])
			}
		}
		evData := jsonObject(nodeData)
		for _, key := range order {
			g := groups[key]
			ids := make([]string, len(g.idx))
			for j, i := range g.idx {
				ids[j] = rows[i].ID
			}
			moved, err := tx.MoveNodes(ctx, ids, g.m)
			if err != nil {
				return err
			}
			for _, i := range g.idx {
				n := rows[i]
				if !moved[n.ID] {
					if in.Count > 0 {
						// All or none: another call took or changed it since it was picked.
						return fmt.Errorf("node %s changed while the bulk deploy took it; nothing was deployed, ask again: %w", n.Name, store.ErrStale)
					}
					picked[i].Accepted, picked[i].Error = false, "the node changed meanwhile; read it again"
					continue
				}
				if deploy {
					if err := s.bulkDeployNode(ctx, tx, n, pinned, in.UserData); err != nil {
						return err
					}
				}
				picked[i].State = g.m.State
				if g.m.SetBatch {
					wake = append(wake, n.ID)
				}
				ev = append(ev, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: p.Actor(), Kind: "node." + string(v),
					FromState: n.State, ToState: g.m.State, Reason: in.Reason, Data: evData})
			}
		}
		if err := tx.AppendEvents(ctx, ev); err != nil {
			return err
		}
		return tx.WakeMany(ctx, wake, "bulk "+string(v))
	})
	if err != nil {
		return BulkResult{}, fmt.Errorf("bulk %s on pool %s: %w", v, pool.Name, err)
	}
	s.woke()
	b.Parked = 0
	res.Batch, res.Held = b, b.State == store.BatchPending
	s.log.LogAttrs(ctx, slog.LevelInfo, "bulk verb applied", slog.String("verb", string(v)), slog.String("batch", b.ID), slog.Int("accepted", accepted),
		slog.Int("leaves", b.Leaves), slog.String("state", b.State), slog.String("actor", p.Actor()))
	return res, nil
}

// checkDeploy checks a deploy's profile (default: "default", set in *profile), image and
// user-data size as the deploy verb does, before anything is written (the image as the catalog
// holds it now; the write pins it again in its transaction).
func (s *Service) checkDeploy(ctx context.Context, profile *string, image string, userData []byte) error {
	if *profile == "" {
		*profile = "default"
	}
	if err := ValidName("profile", *profile); err != nil {
		return err
	}
	if image == "" {
		return invalid("image", "is required: the name or id of a catalog image")
	}
	if err := ValidName("image", image); err != nil {
		return err
	}
	img, err := s.st.VerifiedImage(ctx, image)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return invalid("image", "no catalog image named %q (bcd image list)", truncate(image))
		}
		return invalid("image", "%s: deploy writes only catalog images whose signature verifies", err.Error())
	}
	if img.Format == catalog.FormatFirmware {
		return invalid("image", "%s is a firmware image: a BMC installs it (a pool's firmwareImages); deploy writes raw, qcow2 or iso images", img.Name)
	}
	if err := s.knownDeployProfile(ctx, *profile); err != nil {
		return err
	}
	if len(userData) > MaxUserData {
		return CheckUserData("", userData)
	}
	return nil
}

// bulkDeployNode records what a bulk deploy gives node n beyond its move: the image's pin and
// the user-data, sealed for the node alone (each node's is deleted with its deploy). The
// user-data was checked against the profile's guest once for the bulk.
func (s *Service) bulkDeployNode(ctx context.Context, tx *store.Tx, n store.Node, pinned string, userData []byte) error {
	if err := tx.PinDeployImage(ctx, n.ID, pinned); err != nil {
		return err
	}
	var ud store.UserData
	if len(userData) > 0 {
		ref, err := s.seal(ctx, tx, n.TenantID, string(userData))
		if err != nil {
			return fmt.Errorf("sealing user-data for node %s: %w", n.Name, err)
		}
		sum := sha256.Sum256(userData)
		ud = store.UserData{Ref: ref, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(userData))}
	}
	if ud == (store.UserData{}) && n.UserDataRef == "" {
		return nil
	}
	n.Version++ // MoveNodes moved it
	return tx.SetNodeUserData(ctx, &n, ud)
}

// deployProfileOf is profileOf with the deploy profile dp for the deploying state.
func deployProfileOf(dp workflow.Profile, profileOf batch.ProfileOf) batch.ProfileOf {
	return func(state, target provision.State) (workflow.Profile, error) {
		if state == provision.Deploying {
			return dp, nil
		}
		return profileOf(state, target)
	}
}

// firstSet names the first field set, in a fixed order.
func firstSet(set map[string]bool) string {
	for _, f := range []string{"image", "profile", "userData", "count"} {
		if set[f] {
			return f
		}
	}
	return ""
}

// selectedBy says which selectors picked the nodes, for an error ("" when none did).
func selectedBy(selectors []string) string {
	if len(selectors) == 0 {
		return ""
	}
	return " matching " + strings.Join(selectors, ", ")
}
