package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ReconcileFailures is a node's run of consecutive failed reconciliations, kept on its wake-up
// row (migration 00038). A successful reconciliation ends the run (FinishWakeUp deletes the row
// or resets these in the statement that ends its lease).
type ReconcileFailures struct {
	// Count is how many reconciliations in a row failed.
	Count int
	// Since is when the first of them failed (store microseconds; 0: none).
	Since int64
	// LastError is the last one's error (bounded by whoever records it).
	LastError string
	// FaultRaisedAt is when the run raised its fault on the node (0: not raised).
	FaultRaisedAt int64
}

// noFailures is the SET list that ends a node's run of failed reconciliations.
const noFailures = `failures = 0, failing_since = 0, last_error = '', fault_raised_at = 0`

// LeasedReconcileFailures reads the run of failed reconciliations on the wake-up row of lease l,
// if owner still holds it (held false: the lease expired and someone else took the row, or the
// row is gone; it is theirs to count).
func (t *Tx) LeasedReconcileFailures(ctx context.Context, l Lease, owner string) (f ReconcileFailures, held bool, err error) {
	err = t.queryRow(ctx, `SELECT failures, failing_since, last_error, fault_raised_at FROM reconcile_queue WHERE node_id = ? AND leased_by = ?`,
		l.NodeID, owner).Scan(&f.Count, &f.Since, &f.LastError, &f.FaultRaisedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return ReconcileFailures{}, false, nil
	}
	if err != nil {
		return ReconcileFailures{}, false, fmt.Errorf("reading the failed reconciliations of node %s: %w", l.NodeID, err)
	}
	return f, true, nil
}

// RecordReconcileFailure ends owner's lease l after a failed reconciliation: the row keeps the
// run f and is due again after again, whether or not the node was woken meanwhile (a failing
// node is retried at its back-off; a wake-up after this one makes it due at once). A row owner
// no longer holds is left as it is.
func (t *Tx) RecordReconcileFailure(ctx context.Context, l Lease, owner string, f ReconcileFailures, again time.Duration) error {
	return t.execLater(ctx, "recording the failed reconciliation of node "+l.NodeID, `UPDATE reconcile_queue SET leased_by = '', leased_until = 0, due_at = ?,
		failures = ?, failing_since = ?, last_error = ?, fault_raised_at = ? WHERE node_id = ? AND leased_by = ?`,
		t.at+again.Microseconds(), f.Count, f.Since, f.LastError, f.FaultRaisedAt, l.NodeID, owner)
}

// MarkReconcileFaultRaised records on the node's wake-up row that its run of failed
// reconciliations raised its fault now (a row gone since is not made again).
func (t *Tx) MarkReconcileFaultRaised(ctx context.Context, nodeID string) error {
	return t.execLater(ctx, "recording the reconcile fault of node "+nodeID,
		`UPDATE reconcile_queue SET fault_raised_at = ? WHERE node_id = ? AND failures > 0`, t.at, nodeID)
}

// NodeFaultView is what deciding on a node's fault reads of its row: a few plain columns, which
// read even where the rest of the row does not (a row that cannot be read is one of the reasons
// a reconciliation keeps failing).
type NodeFaultView struct {
	ID, TenantID, State, TargetState, FailedFrom, FaultCode string
	Maintenance                                             bool
}

// NodeFault is a fault written onto a node by NodeFaultView's columns: its state (failed, or
// unchanged), failed_from, fault code and message, maintenance on with its reason. Its target,
// and everything else in the row, stay.
type NodeFault struct {
	State, FailedFrom, FaultCode, FaultMsg, MaintenanceReason string
}

// LockNodeFaultView locks node id's row and reads its NodeFaultView (ErrNotFound: no such node).
func (t *Tx) LockNodeFaultView(ctx context.Context, id string) (NodeFaultView, error) {
	v := NodeFaultView{ID: id}
	err := t.queryRow(ctx, `SELECT tenant_id, state, target_state, failed_from, fault_code, maintenance FROM nodes WHERE id = ?`+t.forUpdate(), id).
		Scan(&v.TenantID, &v.State, &v.TargetState, &v.FailedFrom, &v.FaultCode, &v.Maintenance)
	if errors.Is(err, sql.ErrNoRows) {
		return NodeFaultView{}, fmt.Errorf("node %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return NodeFaultView{}, fmt.Errorf("reading the state and fault of node %s: %w", id, err)
	}
	return v, nil
}

// SetNodeFault writes fault f onto node id with maintenance on, bumping its version (a node gone
// since is left gone).
func (t *Tx) SetNodeFault(ctx context.Context, id string, f NodeFault) error {
	return t.execLater(ctx, "raising fault "+f.FaultCode+" on node "+id, `UPDATE nodes SET state = ?, failed_from = ?, fault_code = ?, fault_message = ?,
		maintenance = ?, maintenance_reason = ?, version = version + 1, updated_at = ? WHERE id = ?`,
		f.State, f.FailedFrom, f.FaultCode, f.FaultMsg, true, f.MaintenanceReason, t.at, id)
}

// ReconcileFailuresOf reads node id's run of failed reconciliations (ok false: it has no
// wake-up row).
func (s *Store) ReconcileFailuresOf(ctx context.Context, id string) (f ReconcileFailures, ok bool, err error) {
	err = s.queryRow(ctx, `SELECT failures, failing_since, last_error, fault_raised_at FROM reconcile_queue WHERE node_id = ?`, id).
		Scan(&f.Count, &f.Since, &f.LastError, &f.FaultRaisedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return ReconcileFailures{}, false, nil
	}
	if err != nil {
		return ReconcileFailures{}, false, fmt.Errorf("reading the failed reconciliations of node %s: %w", id, err)
	}
	return f, true, nil
}
