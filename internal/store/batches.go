package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// ---------------------------------------------------------------- approvals policy

// ApprovalScope names what an approvals policy applies to: the whole installation, a site or a
// pool.
func ApprovalScope(kind, id string) string {
	if kind == "installation" {
		return "installation"
	}
	return kind + ":" + id
}

// ApprovalPolicy is how many approvals destructive commands need in a scope.
type ApprovalPolicy struct {
	Scope     string
	Required  int
	UpdatedBy string
	UpdatedAt int64
}

// SetApprovalPolicy stores (or, with required 0, removes) the policy of a scope.
func (t *Tx) SetApprovalPolicy(ctx context.Context, scope string, required int, by string) error {
	if required == 0 {
		if _, err := t.exec(ctx, `DELETE FROM approval_policies WHERE scope = ?`, scope); err != nil {
			return fmt.Errorf("removing approvals policy of %s: %w", scope, err)
		}
		return nil
	}
	_, err := t.exec(ctx, `INSERT INTO approval_policies (scope, required, updated_by, updated_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (scope) DO UPDATE SET required = excluded.required, updated_by = excluded.updated_by, updated_at = excluded.updated_at`,
		scope, required, by, t.at)
	if err != nil {
		return fmt.Errorf("storing approvals policy of %s: %w", scope, err)
	}
	return nil
}

// ApprovalPolicies lists every policy.
func (s *Store) ApprovalPolicies(ctx context.Context) ([]ApprovalPolicy, error) {
	rows, err := s.queryRows(ctx, `SELECT scope, required, updated_by, updated_at FROM approval_policies ORDER BY scope`)
	return collect(rows, err, "approvals policies", func(r interface{ Scan(...any) error }) (ApprovalPolicy, error) {
		var p ApprovalPolicy
		err := r.Scan(&p.Scope, &p.Required, &p.UpdatedBy, &p.UpdatedAt)
		return p, err
	})
}

// RequiredApprovals is the number of approvals destructive commands on a node of the site and
// pool need: the largest of the installation's, the site's and the pool's policies (a pool
// cannot lower what its site or the installation requires).
func (t *Tx) RequiredApprovals(ctx context.Context, siteID, poolID string) (int, error) {
	// Three lookups by key: with scope IN (…) SQLite built a table of the three scopes at each
	// run to search the key with.
	// SQLite's writer keeps what it read until a statement changes the policies.
	rc, key := t.rows(), siteID+"\x00"+poolID
	if v, ok := rc.memo(memoPolicies, key); ok {
		return v.(int), nil
	}
	var n int
	err := t.queryRow(ctx, `SELECT COALESCE(MAX(required), 0) FROM (
		SELECT required FROM approval_policies WHERE scope = 'installation'
		UNION ALL SELECT required FROM approval_policies WHERE scope = ?
		UNION ALL SELECT required FROM approval_policies WHERE scope = ?) AS p`,
		ApprovalScope("site", siteID), ApprovalScope("pool", poolID)).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("reading approvals policy: %w", err)
	}
	rc.remember(memoPolicies, key, n)
	return n, nil
}

// ---------------------------------------------------------------- batches

// Batch states.
const (
	BatchPending  = "pending"  // waiting for approvals
	BatchApproved = "approved" // quorum reached; nothing started yet
	BatchRunning  = "running"  // a workflow or command under it started
	BatchRejected = "rejected" // refused by an approver: nothing runs under it
	// BatchCancelled: every node left the batch (aborted, deleted) before it was approved.
	BatchCancelled = "cancelled"
)

// Batch is a set of destructive (subject, kind) leaves approved together.
type Batch struct {
	ID, TenantID, SiteID, PoolID string
	Kind                         string // "bulk" or "node"
	Verb                         string // the bulk verb, or the workflow profile of a one-node batch
	Reason, RequestedBy          string
	State                        string
	Required, Size, Leaves       int
	DecidedBy, DecisionReason    string
	CreatedAt, DecidedAt         int64
	StartedAt                    int64
	// Image and ImageDigest are the catalog image a deploy under the batch writes, pinned
	// when the verb was applied (empty when the batch writes no image): what approvers approve.
	Image, ImageDigest string
	// Approvers is filled by reads that ask for it.
	Approvers []string
	// Parked counts nodes still carrying the batch (filled by reads).
	Parked int
}

// Leaf is one (subject, kind) a batch allows.
type Leaf struct {
	Subject, Kind string
}

const batchCols = `id, tenant_id, site_id, pool_id, kind, verb, reason, requested_by, state, required, size, leaves,
	decided_by, decision_reason, created_at, decided_at, started_at, image, image_digest`

func scanBatch(r interface{ Scan(...any) error }) (Batch, error) {
	var b Batch
	err := r.Scan(&b.ID, &b.TenantID, &b.SiteID, &b.PoolID, &b.Kind, &b.Verb, &b.Reason, &b.RequestedBy, &b.State, &b.Required,
		&b.Size, &b.Leaves, &b.DecidedBy, &b.DecisionReason, &b.CreatedAt, &b.DecidedAt, &b.StartedAt, &b.Image, &b.ImageDigest)
	return b, err
}

// InsertBatch creates a batch and its leaves (deduplicated). Its state is pending when
// approvals are required, else approved.
func (t *Tx) InsertBatch(ctx context.Context, b *Batch, leaves []Leaf) error {
	b.ID = NewID(Micros(t.at))
	b.CreatedAt = t.at
	b.State = BatchApproved
	if b.Required > 0 {
		b.State = BatchPending
	}
	seen := make(map[Leaf]bool, len(leaves))
	uniq := leaves[:0:0]
	for _, l := range leaves {
		if !seen[l] {
			seen[l] = true
			uniq = append(uniq, l)
		}
	}
	b.Leaves = len(uniq)
	_, err := t.exec(ctx, `INSERT INTO batches (`+batchCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		b.ID, b.TenantID, b.SiteID, b.PoolID, b.Kind, b.Verb, b.Reason, b.RequestedBy, b.State, b.Required, b.Size, b.Leaves,
		b.DecidedBy, b.DecisionReason, b.CreatedAt, b.DecidedAt, b.StartedAt, b.Image, b.ImageDigest)
	if err != nil {
		return fmt.Errorf("inserting batch: %w", err)
	}
	// Many rows per statement: a bulk batch of 10,000 nodes has tens of thousands of leaves.
	const per = 300
	for i := 0; i < len(uniq); i += per {
		chunk := uniq[i:min(i+per, len(uniq))]
		q := `INSERT INTO batch_leaves (batch_id, subject, kind) VALUES ` + strings.Repeat("(?, ?, ?), ", len(chunk)-1) + `(?, ?, ?)`
		args := make([]any, 0, 3*len(chunk))
		for _, l := range chunk {
			args = append(args, b.ID, l.Subject, l.Kind)
		}
		if _, err := t.exec(ctx, q, args...); err != nil {
			return fmt.Errorf("inserting leaves of batch %s: %w", b.ID, err)
		}
	}
	return nil
}

// Batch reads a batch in the transaction (row-locked on PostgreSQL).
func (t *Tx) Batch(ctx context.Context, id string) (Batch, error) {
	b, err := scanBatch(t.queryRow(ctx, `SELECT `+batchCols+` FROM batches WHERE id = ?`+t.forUpdate(), id))
	if errors.Is(err, sql.ErrNoRows) {
		return Batch{}, fmt.Errorf("batch %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Batch{}, fmt.Errorf("reading batch %s: %w", id, err)
	}
	return b, nil
}

// Batch reads a batch with its approvers and the number of nodes it is still parked on.
func (s *Store) Batch(ctx context.Context, id string) (Batch, error) {
	b, err := scanBatch(s.queryRow(ctx, `SELECT `+batchCols+` FROM batches WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Batch{}, fmt.Errorf("batch %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Batch{}, fmt.Errorf("reading batch %s: %w", id, err)
	}
	if b.Approvers, err = s.approvers(ctx, id); err != nil {
		return Batch{}, err
	}
	if err := s.queryRow(ctx, `SELECT COUNT(*) FROM nodes WHERE batch_id = ?`, id).Scan(&b.Parked); err != nil {
		return Batch{}, fmt.Errorf("counting nodes of batch %s: %w", id, err)
	}
	return b, nil
}

func (s *Store) approvers(ctx context.Context, id string) ([]string, error) {
	rows, err := s.queryRows(ctx, `SELECT approver FROM approvals WHERE batch_id = ? ORDER BY at, approver`, id)
	return collect(rows, err, "approvals", func(r interface{ Scan(...any) error }) (string, error) {
		var a string
		err := r.Scan(&a)
		return a, err
	})
}

// BatchFilter selects batches.
type BatchFilter struct {
	TenantID string
	State    string
	Limit    int
}

// Batches lists batches, newest first, with their approvers.
func (s *Store) Batches(ctx context.Context, f BatchFilter) ([]Batch, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := s.queryRows(ctx, `SELECT `+batchCols+` FROM batches WHERE (? = '' OR tenant_id = ?) AND (? = '' OR state = ?)
		ORDER BY created_at DESC, id DESC LIMIT ?`, f.TenantID, f.TenantID, f.State, f.State, f.Limit)
	out, err := collect(rows, err, "batches", scanBatch)
	if err != nil {
		return nil, err
	}
	for i := range out {
		if out[i].Approvers, err = s.approvers(ctx, out[i].ID); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// BatchLeaves lists up to limit leaves of a batch.
func (s *Store) BatchLeaves(ctx context.Context, id string, limit int) ([]Leaf, error) {
	rows, err := s.queryRows(ctx, `SELECT subject, kind FROM batch_leaves WHERE batch_id = ? ORDER BY subject, kind LIMIT ?`, id, limit)
	return collect(rows, err, "batch leaves", func(r interface{ Scan(...any) error }) (Leaf, error) {
		var l Leaf
		err := r.Scan(&l.Subject, &l.Kind)
		return l, err
	})
}

// BatchFailure is a node whose workflow under a batch failed or was aborted (a rejection
// aborts those waiting).
type BatchFailure struct {
	NodeID, Name, State, FaultCode, Error string // Name: "" once the node is deleted
	At                                    int64  // when the workflow ended
}

// BatchFailures lists the nodes whose workflows under batch id failed or were aborted, the
// first to end first, each node once (its first such workflow): found through
// workflows_batch.
func (s *Store) BatchFailures(ctx context.Context, id string) ([]BatchFailure, error) {
	rows, err := s.queryRows(ctx, `SELECT w.node_id, COALESCE(n.name, ''), w.state, w.fault_code, w.error, w.finished_at
		FROM workflows w LEFT JOIN nodes n ON n.id = w.node_id
		WHERE w.batch_id = ? AND w.state IN ('failed', 'aborted') ORDER BY w.finished_at, w.node_id`, id)
	all, err := collect(rows, err, "a batch's failures", func(r interface{ Scan(...any) error }) (BatchFailure, error) {
		var f BatchFailure
		err := r.Scan(&f.NodeID, &f.Name, &f.State, &f.FaultCode, &f.Error, &f.At)
		return f, err
	})
	seen := make(map[string]bool, len(all))
	return slices.DeleteFunc(all, func(f BatchFailure) bool {
		dup := seen[f.NodeID]
		seen[f.NodeID] = true
		return dup
	}), err
}

// LeafInScope reports whether batch id lists (subject, kind).
func (t *Tx) LeafInScope(ctx context.Context, id, subject, kind string) (bool, error) {
	var one int
	err := t.queryRow(ctx, `SELECT 1 FROM batch_leaves WHERE batch_id = ? AND subject = ? AND kind = ?`, id, subject, kind).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading scope of batch %s: %w", id, err)
	}
	return true, nil
}

// AddApproval records approver's approval of batch id; approving twice is a conflict.
func (t *Tx) AddApproval(ctx context.Context, id, approver string) error {
	if _, err := t.exec(ctx, `INSERT INTO approvals (batch_id, approver, at) VALUES (?, ?, ?)`, id, approver, t.at); err != nil {
		if isUnique(err) {
			return fmt.Errorf("%s already approved batch %s: %w", approver, id, ErrConflict)
		}
		return fmt.Errorf("recording approval of batch %s: %w", id, err)
	}
	return nil
}

// RemoveApproval withdraws approver's approval; it reports whether there was one.
func (t *Tx) RemoveApproval(ctx context.Context, id, approver string) (bool, error) {
	res, err := t.exec(ctx, `DELETE FROM approvals WHERE batch_id = ? AND approver = ?`, id, approver)
	if err != nil {
		return false, fmt.Errorf("withdrawing approval of batch %s: %w", id, err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// CountApprovals counts the approvals of a batch.
func (t *Tx) CountApprovals(ctx context.Context, id string) (int, error) {
	var n int
	if err := t.queryRow(ctx, `SELECT COUNT(*) FROM approvals WHERE batch_id = ?`, id).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting approvals of batch %s: %w", id, err)
	}
	return n, nil
}

// UpdateBatch writes a batch's state and decision.
func (t *Tx) UpdateBatch(ctx context.Context, b *Batch) error {
	_, err := t.exec(ctx, `UPDATE batches SET state = ?, required = ?, decided_by = ?, decision_reason = ?, decided_at = ?, started_at = ? WHERE id = ?`,
		b.State, b.Required, b.DecidedBy, b.DecisionReason, b.DecidedAt, b.StartedAt, b.ID)
	if err != nil {
		return fmt.Errorf("updating batch %s: %w", b.ID, err)
	}
	return nil
}

// StartBatch marks an approved batch running (the first workflow or command under it started).
func (t *Tx) StartBatch(ctx context.Context, id string) error {
	_, err := t.exec(ctx, `UPDATE batches SET state = ?, started_at = ? WHERE id = ? AND state = ?`, BatchRunning, t.at, id, BatchApproved)
	if err != nil {
		return fmt.Errorf("starting batch %s: %w", id, err)
	}
	return nil
}

// NodesOfBatch lists the ids of the nodes a batch is parked on, and of the nodes whose open
// workflow runs under it.
func (t *Tx) NodesOfBatch(ctx context.Context, id string) ([]string, error) {
	rows, err := t.query(ctx, `SELECT id FROM nodes WHERE batch_id = ? UNION SELECT node_id FROM workflows WHERE batch_id = ? AND outcome_applied = ?`, id, id, false)
	return collect(rows, err, "nodes of batch", func(r interface{ Scan(...any) error }) (string, error) {
		var s string
		err := r.Scan(&s)
		return s, err
	})
}

// ReleaseHeldCommands queues the held commands of a batch (approved) and returns their sites.
func (t *Tx) ReleaseHeldCommands(ctx context.Context, id string) error {
	if _, err := t.exec(ctx, `UPDATE commands SET state = 'queued', updated_at = ? WHERE batch_id = ? AND state = 'held'`, t.at, id); err != nil {
		return fmt.Errorf("releasing held commands of batch %s: %w", id, err)
	}
	return nil
}

// FailHeldCommands fails the held commands of a batch (rejected) and returns their nodes.
func (t *Tx) FailHeldCommands(ctx context.Context, id, why string) ([]Command, error) {
	rows, err := t.query(ctx, `SELECT `+commandCols+` FROM commands WHERE batch_id = ? AND state = 'held'`, id)
	cmds, err := collect(rows, err, "held commands", scanCommand)
	if err != nil {
		return nil, err
	}
	for i := range cmds {
		cmds[i].State, cmds[i].Error, cmds[i].FinishedAt = "failed", why, t.at
		if err := t.UpdateCommand(ctx, &cmds[i]); err != nil {
			return nil, err
		}
	}
	return cmds, nil
}

// SiteAgentIDs lists the ids of every site agent of a site that ever joined, in order. (Sorted
// here: SQLite sorted the few rows in a sorter of its own, which cost more than the search.)
func (t *Tx) SiteAgentIDs(ctx context.Context, siteID string) ([]string, error) {
	rows, err := t.query(ctx, `SELECT id FROM agents WHERE kind = 'site' AND site_id = ?`, siteID)
	ids, err := collect(rows, err, "site agents", scanID)
	slices.Sort(ids)
	return ids, err
}

// NodePlacement returns the site and pool of a node.
func (t *Tx) NodePlacement(ctx context.Context, nodeID string) (siteID, poolID string, err error) {
	err = t.queryRow(ctx, `SELECT site_id, pool_id FROM nodes WHERE id = ?`, nodeID).Scan(&siteID, &poolID)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", fmt.Errorf("node %s: %w", nodeID, ErrNotFound)
	}
	if err != nil {
		return "", "", fmt.Errorf("reading placement of node %s: %w", nodeID, err)
	}
	return siteID, poolID, nil
}

// AppendEvents adds many event rows in the transaction, many per statement.
func (t *Tx) AppendEvents(ctx context.Context, evs []Event) error {
	if t.lc != nil {
		t.holdEvents(evs...)
		return nil
	}
	const per = 100
	for i := 0; i < len(evs); i += per {
		chunk := evs[i:min(i+per, len(evs))]
		q := `INSERT INTO events (at, tenant_id, node_id, actor, kind, from_state, to_state, reason, data) VALUES ` +
			strings.Repeat("(?, ?, ?, ?, ?, ?, ?, ?, ?), ", len(chunk)-1) + `(?, ?, ?, ?, ?, ?, ?, ?, ?)`
		args := make([]any, 0, 9*len(chunk))
		for _, e := range chunk {
			if e.Data == "" {
				e.Data = "{}"
			}
			args = append(args, t.at, e.TenantID, e.NodeID, e.Actor, e.Kind, e.FromState, e.ToState, e.Reason, e.Data)
		}
		if err := t.execLater(ctx, fmt.Sprintf("appending %d events", len(chunk)), q, args...); err != nil {
			return err
		}
	}
	return nil
}

// WakeMany queues the reconcilers of many nodes now, many per statement. A node listed twice
// is woken once: PostgreSQL refuses an INSERT … ON CONFLICT DO UPDATE that would update a row
// twice (SQLite takes it), and the whole transaction would fail there alone.
func (t *Tx) WakeMany(ctx context.Context, nodeIDs []string, reason string) error {
	seen := make(map[string]bool, len(nodeIDs))
	uniq := make([]string, 0, len(nodeIDs))
	for _, id := range nodeIDs {
		if !seen[id] {
			seen[id] = true
			uniq = append(uniq, id)
		}
	}
	nodeIDs = uniq
	const per = 200
	for i := 0; i < len(nodeIDs); i += per {
		chunk := nodeIDs[i:min(i+per, len(nodeIDs))]
		q := `INSERT INTO reconcile_queue (node_id, due_at, reason, enqueued_at, seq) VALUES ` +
			strings.Repeat("(?, ?, ?, ?, 1), ", len(chunk)-1) + `(?, ?, ?, ?, 1)
			ON CONFLICT (node_id) DO UPDATE SET due_at = CASE WHEN excluded.due_at < reconcile_queue.due_at THEN excluded.due_at ELSE reconcile_queue.due_at END,
			reason = excluded.reason, enqueued_at = excluded.enqueued_at, seq = reconcile_queue.seq + 1`
		args := make([]any, 0, 4*len(chunk))
		for _, id := range chunk {
			args = append(args, id, t.at, reason, t.at)
		}
		if _, err := t.exec(ctx, q, args...); err != nil {
			return fmt.Errorf("queueing %d reconcilers: %w", len(chunk), err)
		}
	}
	return nil
}

// HasApproval reports whether approver approved batch id.
func (t *Tx) HasApproval(ctx context.Context, id, approver string) (bool, error) {
	var one int
	err := t.queryRow(ctx, `SELECT 1 FROM approvals WHERE batch_id = ? AND approver = ?`, id, approver).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading approvals of batch %s: %w", id, err)
	}
	return true, nil
}

// AnyApprovalPolicy reports whether any scope requires approvals (the queue's fast path).
func (t *Tx) AnyApprovalPolicy(ctx context.Context) (bool, error) {
	// SQLite's writer keeps what it read until a statement changes the policies.
	rc := t.rows()
	if v, ok := rc.memo(memoPolicies, ""); ok { // (a site and pool key holds a NUL)
		return v.(bool), nil
	}
	var one int
	err := t.queryRow(ctx, `SELECT 1 FROM approval_policies WHERE required > 0 LIMIT 1`).Scan(&one)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("reading approvals policies: %w", err)
	}
	some := err == nil
	rc.remember(memoPolicies, "", some)
	return some, nil
}

// BulkMove is one move applied to many nodes that were read in the same state (a bulk verb):
// From* are what the decision was taken on, the rest what the nodes get.
type BulkMove struct {
	FromState, FromTarget                    string
	FromMaintenance                          bool
	State, TargetState, ChainVerb            string
	VerbFrom, VerbBy, BatchID, WipeMode      string
	SetChain, SetVerb, SetBatch, SetWipeMode bool
	// SetDeploy sets the deploy's profile and image (a bulk deploy; the image's pin is
	// PinDeployImage's).
	DeployProfile, DeployImage string
	SetDeploy                  bool
}

// MoveNodes applies m to the nodes of ids still in the state the move was decided on (many per
// statement; no per-row version: the state, target and maintenance flag are the condition). It
// returns the ids moved; the others changed meanwhile.
func (t *Tx) MoveNodes(ctx context.Context, ids []string, m BulkMove) (map[string]bool, error) {
	moved := make(map[string]bool, len(ids))
	const per = 500
	for i := 0; i < len(ids); i += per {
		chunk := ids[i:min(i+per, len(ids))]
		q := `UPDATE nodes SET state = ?, target_state = ?,
			chain_verb = CASE WHEN ? THEN ? ELSE chain_verb END,
			verb_from = CASE WHEN ? THEN ? ELSE verb_from END,
			verb_by = CASE WHEN ? THEN ? ELSE verb_by END,
			batch_id = CASE WHEN ? THEN ? ELSE batch_id END,
			wipe_mode = CASE WHEN ? THEN ? ELSE wipe_mode END,
			deploy_profile = CASE WHEN ? THEN ? ELSE deploy_profile END,
			deploy_image = CASE WHEN ? THEN ? ELSE deploy_image END,
			version = version + 1, updated_at = ?
			WHERE state = ? AND target_state = ? AND maintenance = ? AND id IN (?` + strings.Repeat(", ?", len(chunk)-1) + `) RETURNING id`
		args := []any{m.State, m.TargetState, m.SetChain, m.ChainVerb, m.SetVerb, m.VerbFrom, m.SetVerb, m.VerbBy, m.SetBatch, m.BatchID,
			m.SetWipeMode, m.WipeMode, m.SetDeploy, m.DeployProfile, m.SetDeploy, m.DeployImage, t.at, m.FromState, m.FromTarget, m.FromMaintenance}
		for _, id := range chunk {
			args = append(args, id)
		}
		rows, err := t.query(ctx, q, args...)
		got, err := collect(rows, err, "moved nodes", func(r interface{ Scan(...any) error }) (string, error) {
			var s string
			err := r.Scan(&s)
			return s, err
		})
		if err != nil {
			return nil, fmt.Errorf("moving %d nodes to %s: %w", len(chunk), m.State, err)
		}
		for _, id := range got {
			moved[id] = true
		}
	}
	return moved, nil
}

// CancelDeserted cancels batch id if it is still pending and no node is parked on it any more
// (every node left before it was approved: no approver is to approve work nothing waits for).
// It says whether it did; an unknown batch is none.
func (t *Tx) CancelDeserted(ctx context.Context, id string) (bool, error) {
	b, err := t.Batch(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil || b.State != BatchPending {
		return false, err
	}
	parked, err := t.CountParked(ctx, id)
	if err != nil || parked > 0 {
		return false, err
	}
	b.State, b.DecidedBy, b.DecidedAt = BatchCancelled, "reconciler", t.at
	return true, t.UpdateBatch(ctx, &b)
}

// CountParked counts the nodes a batch is parked on.
func (t *Tx) CountParked(ctx context.Context, id string) (int, error) {
	var n int
	if err := t.queryRow(ctx, `SELECT COUNT(*) FROM nodes WHERE batch_id = ?`, id).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting nodes of batch %s: %w", id, err)
	}
	return n, nil
}

// HoldQueuedCommands holds again the queued commands of a batch no agent has taken yet (an
// approval withdrawn below the quorum before the batch started): they wait for the batch as
// they did before it was approved. It returns how many.
func (t *Tx) HoldQueuedCommands(ctx context.Context, id string) (int, error) {
	res, err := t.exec(ctx, `UPDATE commands SET state = 'held', target_agent = '', updated_at = ? WHERE batch_id = ? AND state = 'queued'`, t.at, id)
	if err != nil {
		return 0, fmt.Errorf("holding the queued commands of batch %s: %w", id, err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// UnwatchedPendingBatches lists, oldest first, up to limit batches still pending that were
// created at or before createdBy and that no node's reconciliation will ever look at: none
// parked on a node, no open workflow under it (a one-command batch, or one whose workflow
// ended). The expiry of the others is decided with their workflows.
func (t *Tx) UnwatchedPendingBatches(ctx context.Context, createdBy int64, limit int) ([]Batch, error) {
	rows, err := t.query(ctx, `SELECT `+batchCols+` FROM batches b WHERE state = ? AND created_at <= ?
		AND NOT EXISTS (SELECT 1 FROM nodes WHERE batch_id = b.id)
		AND NOT EXISTS (SELECT 1 FROM workflows WHERE batch_id = b.id AND outcome_applied = ?)
		ORDER BY created_at, id LIMIT ?`, BatchPending, createdBy, false, limit)
	return collect(rows, err, "unwatched pending batches", scanBatch)
}

// PinDeployImage records the digest of the catalog image a deploy verb asked for, as the
// catalog held it then ("" clears it).
func (t *Tx) PinDeployImage(ctx context.Context, nodeID, digest string) error {
	return t.onNode(nodeID, nil, func(row int64) error {
		if _, err := t.updateByRow(ctx, `UPDATE nodes SET deploy_image_digest = ? WHERE id = ?`, `UPDATE nodes SET deploy_image_digest = ? WHERE rowid = ? AND id = ?`, row, []any{digest}, nodeID); err != nil {
			return fmt.Errorf("pinning the deploy image of node %s: %w", nodeID, err)
		}
		return nil
	})
}

// DeployImagePin reads the digest PinDeployImage recorded ("" : none).
func (t *Tx) DeployImagePin(ctx context.Context, nodeID string) (string, error) {
	var d string
	err := t.queryRow(ctx, `SELECT deploy_image_digest FROM nodes WHERE id = ?`, nodeID).Scan(&d)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("node %s: %w", nodeID, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("reading the deploy image pin of node %s: %w", nodeID, err)
	}
	return d, nil
}

// holdEvents keeps events a write of SQLite's writer appends, for insertHeldEvents before the
// commit: a group's events go in a few statements of many rows instead of one or two statements
// per write (each statement costs the writer its own run through SQLite, about a third of an
// event's insert). What the events' write undoes (its savepoint rolled back, its pass run
// again) drops them. Nothing in a write reads the events it appended: their ids, in the order
// appended, are given at the insert, in the same transaction.
func (t *Tx) holdEvents(evs ...Event) {
	n := len(t.events)
	t.events = append(t.events, evs...)
	t.OnUndo(func() { t.events = t.events[:min(n, len(t.events))] }) // (inserted since: the rollback took them)
}

// heldEventChunks are the rows per statement insertHeldEvents uses, largest first: a few
// statements of fixed shape, each kept prepared.
var heldEventChunks = [...]int{64, 32, 16, 8, 4, 2, 1}

// eventRowParams are the parameters of one event's row in an insert (at, then 8 texts).
const eventRowParams = 9

// insertHeldEvents inserts the events held (holdEvents), in the order appended. Only SQLite's
// writer holds events: its connection binds them as they are (liteConn.execEvents).
func (t *Tx) insertHeldEvents(ctx context.Context) error {
	held, evs := t.events, t.events
	defer func() { clear(held); t.events = held[:0] }() // (the next pass holds its events in the same array)
	if len(evs) == 0 {
		return nil
	}
	if t.lc == nil {
		return fmt.Errorf("appending %d events: held outside SQLite's writer", len(evs))
	}
	for i, per := range heldEventChunks {
		q := &t.s.heldEventInserts[i]
		if *q == "" {
			// (OR FAIL: no statement journal for its many rows; Store.orFail.)
			*q = `INSERT OR FAIL INTO events (at, tenant_id, node_id, actor, kind, from_state, to_state, reason, data) VALUES ` +
				strings.Repeat("(?, ?, ?, ?, ?, ?, ?, ?, ?), ", per-1) + `(?, ?, ?, ?, ?, ?, ?, ?, ?)`
		}
		for ; len(evs) >= per; evs = evs[per:] {
			if err := t.lc.execEvents(t.s.bind(*q), t.at, evs[:per]); err != nil {
				return fmt.Errorf("appending %d events: %w", per, err)
			}
		}
	}
	return nil
}
