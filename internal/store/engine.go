package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"bcd/internal/command"
)

// ---------------------------------------------------------------- reconciler leases

// Lease is a claimed wake-up: the node is reconciled by its holder alone until Until.
type Lease struct {
	NodeID string
	Seq    int64
	Reason string
}

// ClaimWakeUps leases up to limit due wake-up rows for owner. A row leased by someone else and
// not expired is skipped (PostgreSQL: SKIP LOCKED), so one node is never reconciled twice at
// once, across replicas too.
func (s *Store) ClaimWakeUps(ctx context.Context, owner string, lease time.Duration, limit int) ([]Lease, error) {
	var out []Lease
	err := s.Write(ctx, func(t *Tx) error {
		out = out[:0]
		skip := ""
		if s.engine == Postgres {
			skip = " FOR UPDATE SKIP LOCKED"
		}
		rows, err := t.query(ctx, `UPDATE reconcile_queue SET leased_by = ?, leased_until = ?
			WHERE node_id IN (SELECT node_id FROM reconcile_queue WHERE due_at <= ? AND leased_until < ? ORDER BY due_at LIMIT ?`+skip+`)
			RETURNING node_id, seq, reason`, owner, t.at+lease.Microseconds(), t.at, t.at, limit)
		if err != nil {
			return fmt.Errorf("claiming wake-ups: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var l Lease
			if err := rows.Scan(&l.NodeID, &l.Seq, &l.Reason); err != nil {
				return fmt.Errorf("reading wake-up: %w", err)
			}
			out = append(out, l)
		}
		return rows.Err()
	})
	return out, err
}

// FinishWakeUp ends the lease of a successful reconciliation. With again == 0 the row is
// deleted unless the node was woken while leased (seq moved), in which case it is released for
// the next claim; with again > 0 it is kept and due again after that delay (a deadline). Either
// way the node's run of failed reconciliations ends (RecordReconcileFailure counts them): in the
// statement that ends the lease, so a success costs no statement more.
func (t *Tx) FinishWakeUp(ctx context.Context, l Lease, owner string, again time.Duration) error {
	if again <= 0 {
		res, err := t.exec(ctx, `DELETE FROM reconcile_queue WHERE node_id = ? AND seq = ? AND leased_by = ?`, l.NodeID, l.Seq, owner)
		if err != nil {
			return fmt.Errorf("finishing wake-up of %s: %w", l.NodeID, err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return nil
		}
		if _, err := t.exec(ctx, `UPDATE reconcile_queue SET leased_by = '', leased_until = 0, `+noFailures+` WHERE node_id = ? AND leased_by = ?`, l.NodeID, owner); err != nil {
			return fmt.Errorf("releasing the wake-up of %s: %w", l.NodeID, err)
		}
		return nil
	}
	due := t.at + again.Microseconds()
	if err := t.execLater(ctx, "requeueing "+l.NodeID, `UPDATE reconcile_queue SET leased_by = '', leased_until = 0, `+noFailures+`,
		due_at = CASE WHEN seq = ? THEN ? ELSE due_at END WHERE node_id = ? AND leased_by = ?`, l.Seq, due, l.NodeID, owner); err != nil {
		return err
	}
	// A lease that expired and was taken over by another owner is theirs now: nothing to do.
	return nil
}

// setWakeUpQuery is SetWakeUp's upsert of a node's wake-up row (arguments: the node, its due
// time, the reason, now, and now again); setWakeUpOfSeqQuery the same of a row still at a wake
// sequence (the sequence before the second now).
const (
	setWakeUpHead = `INSERT INTO reconcile_queue (node_id, due_at, reason, enqueued_at, seq) VALUES (?, ?, ?, ?, 1)
			ON CONFLICT (node_id) DO UPDATE SET due_at = excluded.due_at, reason = excluded.reason, enqueued_at = excluded.enqueued_at, ` + noFailures + `
			WHERE reconcile_queue.leased_by = ''`
	setWakeUpTail = `
			AND NOT (reconcile_queue.due_at > ? AND reconcile_queue.due_at <= excluded.due_at AND reconcile_queue.failures = 0)`
	setWakeUpQuery      = setWakeUpHead + setWakeUpTail
	setWakeUpOfSeqQuery = setWakeUpHead + ` AND reconcile_queue.seq = ?` + setWakeUpTail
)

// SetWakeUp replaces the node's wake-up by one due after again, or removes it with again == 0,
// for a reconciliation that ran outside a lease. A row leased by a worker is left to it
// (FinishWakeUp ends it after the worker's own reconciliation).
//
// seq is the row's wake sequence as read before the reconciliation read anything (WakeUpSeq; 0:
// there was no row), and a row woken since is left as it is: the wake-up is owed to a write the
// reconciliation may not have seen. With seq < 0 the row is replaced whatever it holds: for
// SQLite's single writer, under which the reconciliation saw every write before it. A
// replaced row's run of failed reconciliations ends: this one succeeded.
//
// A row still ahead that is due no later than again is kept as it is (unless it holds a run of
// failures): the reconciler, woken at it, finds nothing due yet and sets the next. A node that
// goes from step to step, each with its own deadline, then writes its wake-up row (and the
// index over due times) once, not at every step.
func (t *Tx) SetWakeUp(ctx context.Context, nodeID, reason string, again time.Duration, seq int64) error {
	// (The statements' arguments and what is said on an error are built only for a statement
	// that runs: the writer's cache makes most calls write nothing.)
	what := func() string { return "setting the wake-up of node " + nodeID }
	switch {
	case again <= 0 && seq == 0:
		return nil // no row to remove; one that appeared since is owed
	case again <= 0 && seq > 0:
		return t.execLater(ctx, what(), `DELETE FROM reconcile_queue WHERE node_id = ? AND leased_by = '' AND seq = ?`, nodeID, seq)
	case again <= 0:
		return t.execLater(ctx, what(), `DELETE FROM reconcile_queue WHERE node_id = ? AND leased_by = ''`, nodeID)
	default:
		due := t.at + again.Microseconds()
		rc := t.rows()
		if seq >= 0 {
			return t.execLater(ctx, what(), setWakeUpOfSeqQuery, nodeID, due, reason, t.at, seq, t.at)
		}
		if rc == nil {
			return t.execLater(ctx, what(), setWakeUpQuery, nodeID, due, reason, t.at, t.at)
		}
		// SQLite's writer: what the statement would keep is kept without it. The row is the
		// cache's, else read (one writer: nothing changes it in between).
		w, known := rc.wake(nodeID)
		if known && wakeKeeps(w.due, 0, t.at, due) {
			return nil
		}
		inserts := false
		if !known {
			var failures int
			var leased bool
			err := t.queryRow(ctx, `SELECT rowid, due_at, failures, leased_by <> '' FROM reconcile_queue WHERE node_id = ?`, nodeID).Scan(&w.row, &w.due, &failures, &leased)
			switch {
			case err == nil && leased:
				return nil // (left to its holder)
			case err == nil && wakeKeeps(w.due, failures, t.at, due):
				rc.putWake(nodeID, w.due, w.row)
				return nil
			case errors.Is(err, sql.ErrNoRows):
				inserts = true
			case err != nil:
				return fmt.Errorf("reading the wake-up of node %s: %w", nodeID, err)
			}
		}
		res, err := t.exec(ctx, setWakeUpQuery, nodeID, due, reason, t.at, t.at)
		if err != nil {
			return fmt.Errorf("%s: %w", what(), err)
		}
		if n, err := res.RowsAffected(); err == nil && n == 1 {
			if inserts {
				w.row, _ = res.LastInsertId()
			}
			rc.putWake(nodeID, due, w.row)
		}
		return nil
	}
}

// WakeUpSeq reads the node's wake sequence (0: no wake-up row), for SetWakeUp.
func (t *Tx) WakeUpSeq(ctx context.Context, nodeID string) (int64, error) {
	var seq int64
	err := t.queryRow(ctx, `SELECT seq FROM reconcile_queue WHERE node_id = ?`, nodeID).Scan(&seq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the wake-up of node %s: %w", nodeID, err)
	}
	return seq, nil
}

// WakeAt queues the node's reconciler at a given time (a deadline), keeping an earlier one.
func (t *Tx) WakeAt(ctx context.Context, nodeID, reason string, at int64) error {
	return t.Wake(ctx, nodeID, reason, time.Duration(at-t.at)*time.Microsecond)
}

// At is the transaction's clock, Unix microseconds.
func (t *Tx) At() int64 { return t.at }

// ---------------------------------------------------------------- workflows

// Workflow is a running or finished profile on a node.
type Workflow struct {
	ID, NodeID, TenantID, Profile, Owner, NodeState string
	Steps, Cleanup                                  string // JSON
	CommandKinds                                    []string
	State, Phase                                    string
	StepIndex, StepAttempt                          int
	StepStartedAt, StepDeadline                     int64
	CurrentCommand                                  string
	// BootEpoch is when the workflow last made the machine boot (a power action, kexec): an
	// agent that joined before it belongs to the previous boot.
	BootEpoch                        int64
	AbortRequested                   bool
	FaultCode, Error                 string
	OutcomeApplied                   bool
	CreatedAt, UpdatedAt, FinishedAt int64
	// BatchID is the batch whose scope covers the workflow's destructive commands.
	BatchID string
}

// workflowCols are the columns of a workflow's row, in the order InsertWorkflow gives them.
// steps and cleanup hold those of a workflow stored before plans (whose plan is empty: see
// selectWorkflows); a workflow's are in its plan's row.
const workflowCols = `id, node_id, tenant_id, profile, owner, node_state, steps, cleanup, plan, command_kinds, state, phase,
	step_index, step_attempt, step_started_at, step_deadline, current_command, boot_epoch, abort_requested, fault_code, error,
	outcome_applied, created_at, updated_at, finished_at, batch_id`

// selectWorkflows reads workflows (w) with their plan's steps and cleanup (p; a workflow stored
// before plans names none and holds its own), as scanWorkflow scans them. A query adds its
// conditions on w (WHERE ...) and its order. The workflow is read first (a LEFT JOIN keeps
// that order), then its plan by its key.
const selectWorkflows = `SELECT w.id, w.node_id, w.tenant_id, w.profile, w.owner, w.node_state,
	COALESCE(p.steps, w.steps), COALESCE(p.cleanup, w.cleanup), w.command_kinds, w.state, w.phase, w.step_index,
	w.step_attempt, w.step_started_at, w.step_deadline, w.current_command, w.boot_epoch, w.abort_requested, w.fault_code,
	w.error, w.outcome_applied, w.created_at, w.updated_at, w.finished_at, w.batch_id`

const fromWorkflows = ` FROM workflows w LEFT JOIN workflow_plans p ON p.digest = w.plan`

// planDigest is the key a workflow's plan (its steps and cleanup, JSON) is kept under in
// workflow_plans: the SHA-256 of both, in hex.
func planDigest(steps, cleanup string) string {
	h := sha256.New()
	h.Write([]byte(steps))
	h.Write([]byte{0})
	h.Write([]byte(cleanup))
	return hex.EncodeToString(h.Sum(nil))
}

// planTouchEvery is how long a plan's used_at may lag behind the workflows that begin on it:
// a workflow that begins on a plan older than that moves it on. History retention deletes only
// plans unused for longer than twice that (see purgePlans).
const planTouchEvery = int64(time.Hour / time.Microsecond)

// A workflow's plan is kept by two statements, in this order (see planDigest and
// planTouchEvery): touchPlanQuery moves on a plan last used more than planTouchEvery ago
// (locking its row on PostgreSQL, so that a purge that read it as unused finds it used when
// it comes to delete it), then insertPlanQuery inserts it if it is not there. A plan used
// lately is neither written nor locked: with ON CONFLICT DO UPDATE every transaction beginning
// a workflow on PostgreSQL would hold its plan's row lock until it commits, one after another.
// The other order would leave a window: an insert that found the plan there, then a purge that
// deletes it, then a touch that finds nothing.
const (
	touchPlanQuery  = `UPDATE workflow_plans SET used_at = ? WHERE digest = ? AND used_at < ?`
	insertPlanQuery = `INSERT INTO workflow_plans (digest, steps, cleanup, used_at) VALUES (?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING`
)

// keepPlan keeps w's plan (digest plan) for a workflow beginning on it (touchPlanQuery, then
// insertPlanQuery). SQLite's writer remembers when the plan was last used as it found or left it
// (memoPlans; any change to the table, a purge's too, forgets it), and runs neither statement
// while that is within planTouchEvery: both would change nothing.
func (t *Tx) keepPlan(ctx context.Context, rc *workflowCache, plan string, w *Workflow, what string) error {
	if rc == nil {
		if err := t.execLater(ctx, "marking the plan of "+what+" used", touchPlanQuery, t.at, plan, t.at-planTouchEvery); err != nil {
			return err
		}
		return t.execLater(ctx, "keeping the plan of "+what, insertPlanQuery, plan, w.Steps, w.Cleanup, t.at)
	}
	if v, ok := rc.memo(memoPlans, plan); ok && v.(int64) >= t.at-planTouchEvery {
		return nil
	}
	touched, err := t.exec(ctx, touchPlanQuery, t.at, plan, t.at-planTouchEvery)
	if err != nil {
		return fmt.Errorf("marking the plan of %s used: %w", what, err)
	}
	inserted, err := t.exec(ctx, insertPlanQuery, plan, w.Steps, w.Cleanup, t.at)
	if err != nil {
		return fmt.Errorf("keeping the plan of %s: %w", what, err)
	}
	usedAt := t.at
	if a, _ := touched.RowsAffected(); a == 0 {
		if b, _ := inserted.RowsAffected(); b == 0 {
			// (There, used lately: when, read once.)
			if err := t.queryRow(ctx, `SELECT used_at FROM workflow_plans WHERE digest = ?`, plan).Scan(&usedAt); err != nil {
				return fmt.Errorf("reading the plan of %s: %w", what, err)
			}
		}
	}
	rc.remember(memoPlans, plan, usedAt)
	return nil
}

func scanWorkflow(r interface{ Scan(...any) error }) (Workflow, error) {
	var w Workflow
	var kinds string
	err := r.Scan(&w.ID, &w.NodeID, &w.TenantID, &w.Profile, &w.Owner, &w.NodeState, &w.Steps, &w.Cleanup, &kinds, &w.State, &w.Phase,
		&w.StepIndex, &w.StepAttempt, &w.StepStartedAt, &w.StepDeadline, &w.CurrentCommand, &w.BootEpoch, &w.AbortRequested, &w.FaultCode, &w.Error,
		&w.OutcomeApplied, &w.CreatedAt, &w.UpdatedAt, &w.FinishedAt, &w.BatchID)
	if err != nil {
		return Workflow{}, err
	}
	if err := decodeStringSlice(kinds, &w.CommandKinds); err != nil {
		return Workflow{}, fmt.Errorf("decoding command kinds of workflow %s: %w", w.ID, err)
	}
	return w, nil
}

// InsertWorkflow creates a workflow row.
func (t *Tx) InsertWorkflow(ctx context.Context, w *Workflow) error {
	w.ID = NewID(Micros(t.at))
	w.CreatedAt, w.UpdatedAt = t.at, t.at
	const q = `INSERT INTO workflows (` + workflowCols + `) VALUES (?, ?, ?, ?, ?, ?, '', '', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	kinds := mustJSON(w.CommandKinds)
	plan := planDigest(w.Steps, w.Cleanup)
	args := t.args(&w.ID, &w.NodeID, &w.TenantID, &w.Profile, &w.Owner, &w.NodeState, plan, kinds, &w.State, &w.Phase,
		&w.StepIndex, &w.StepAttempt, &w.StepStartedAt, &w.StepDeadline, &w.CurrentCommand, &w.BootEpoch, &w.AbortRequested, &w.FaultCode, &w.Error,
		&w.OutcomeApplied, &w.CreatedAt, &w.UpdatedAt, &w.FinishedAt, &w.BatchID)
	what := "inserting workflow " + w.Profile + " for node " + w.NodeID
	rc := t.rows()
	if err := t.keepPlan(ctx, rc, plan, w, what); err != nil {
		return err
	}
	if rc == nil {
		return t.execLater(ctx, what, q, args...)
	}
	was, cached := rc.peekWorkflow(w.NodeID)
	if !cached && !w.OutcomeApplied {
		// A node whose open workflow the cache does not know (its last one just ended, and
		// left the cache): whether it has one is a search of an index, cheaper than the read
		// of the new one (with its plan) that the next report on the node would make.
		var one int
		switch err := t.queryRow(ctx, `SELECT 1 FROM workflows WHERE node_id = ? AND outcome_applied = ? LIMIT 1`, w.NodeID, false).Scan(&one); {
		case errors.Is(err, sql.ErrNoRows):
			cached = true // (and none open: was.ok false)
		case err != nil:
			return fmt.Errorf("%s: looking for its node's open workflow: %w", what, err)
		}
	}
	res, err := t.exec(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if cached && !was.ok && !w.OutcomeApplied {
		// The node had none open: this one is, as a read would return it.
		now := *w
		if err := decodeStringSlice(kinds, &now.CommandKinds); err == nil {
			row, _ := res.LastInsertId()
			rc.putWorkflow(now, row)
		}
	}
	return nil
}

// UpdateWorkflow writes a workflow's progress.
func (t *Tx) UpdateWorkflow(ctx context.Context, w *Workflow) error {
	w.UpdatedAt = t.at
	args := workflowStepArgs(w, 3)
	// SQLite's writer: the node's open workflow as its cache holds it, and the row's rowid when
	// that is this workflow (0: not known; see updateByRow).
	rc := t.rows()
	was, cached := rc.peekWorkflow(w.NodeID)
	held := cached && was.ok && was.w.ID == w.ID
	var row int64
	if held {
		row = was.row
	}
	if t.lc != nil && !w.OutcomeApplied && w.FinishedAt == 0 {
		// A running workflow's step moves on, its outcome and end as they are stored: SQLite
		// rewrites the entries of every index over a column an UPDATE sets, changed or not
		// (workflows_node_open, and workflows_open whose condition names outcome_applied: four
		// b-tree writes), so this sets neither column while the row still holds these values.
		// By its rowid where the cache holds it (the whole update below if that changed
		// nothing).
		q, qArgs := `UPDATE workflows SET `+workflowStepSet+` WHERE id = ? AND NOT outcome_applied AND finished_at = 0`, append(args, w.ID)
		if row > 0 {
			q, qArgs = `UPDATE workflows SET `+workflowStepSet+` WHERE rowid = ? AND id = ? AND NOT outcome_applied AND finished_at = 0`, append(args, row, w.ID)
		}
		res, err := t.exec(ctx, q, qArgs...)
		if err != nil {
			return fmt.Errorf("updating workflow %s: %w", w.ID, err)
		}
		if n, _ := res.RowsAffected(); n > 0 {
			if held {
				// Still the node's open workflow, as cached with what the update set.
				rc.putStepped(was, steppedWorkflow(was.w, w))
			}
			return nil
		}
		// (stored ended, or outcome applied: the whole update below)
	}
	if row > 0 {
		if _, err := t.updateByRow(ctx, updateWorkflowWhole, updateWorkflowWholeRow, row, append(args, w.OutcomeApplied, w.FinishedAt), w.ID); err != nil {
			return fmt.Errorf("updating workflow %s: %w", w.ID, err)
		}
		return nil
	}
	return t.execLater(ctx, "updating workflow "+w.ID, updateWorkflowWhole, append(args, w.OutcomeApplied, w.FinishedAt, w.ID)...)
}

// workflowStepSet is what UpdateWorkflow sets besides the workflow's outcome and end, with
// workflowStepArgs; updateWorkflowWhole sets those too.
const (
	workflowStepSet = `state = ?, phase = ?, step_index = ?, step_attempt = ?, step_started_at = ?,
	step_deadline = ?, current_command = ?, boot_epoch = ?, abort_requested = ?, fault_code = ?, error = ?, updated_at = ?`
	updateWorkflowWhole    = `UPDATE workflows SET ` + workflowStepSet + `, outcome_applied = ?, finished_at = ? WHERE id = ?`
	updateWorkflowWholeRow = `UPDATE workflows SET ` + workflowStepSet + `, outcome_applied = ?, finished_at = ? WHERE rowid = ? AND id = ?`
)

// steppedWorkflow is the row UpdateWorkflow's step update leaves where it found was: w's
// fields of workflowStepSet.
func steppedWorkflow(was Workflow, w *Workflow) Workflow {
	was.State, was.Phase, was.StepIndex, was.StepAttempt, was.StepStartedAt = w.State, w.Phase, w.StepIndex, w.StepAttempt, w.StepStartedAt
	was.StepDeadline, was.CurrentCommand, was.BootEpoch, was.AbortRequested = w.StepDeadline, w.CurrentCommand, w.BootEpoch, w.AbortRequested
	was.FaultCode, was.Error, was.UpdatedAt = w.FaultCode, w.Error, w.UpdatedAt
	return was
}

// (Values, not pointers to w's fields (Tx.args): the engine's run holds the workflow it updates,
// and pointers to its fields would move every run to the heap.)
func workflowStepArgs(w *Workflow, extra int) []any {
	return append(make([]any, 0, 12+extra), w.State, w.Phase, w.StepIndex, w.StepAttempt, w.StepStartedAt, w.StepDeadline, w.CurrentCommand, w.BootEpoch,
		w.AbortRequested, w.FaultCode, w.Error, w.UpdatedAt)
}

// openWorkflowQuery reads a node's open workflow (arguments: the node's id, false).
const openWorkflowQuery = selectWorkflows + fromWorkflows + ` WHERE w.node_id = ? AND w.outcome_applied = ? ORDER BY w.created_at DESC LIMIT 1`

// openWorkflowRowidQuery is openWorkflowQuery with the row's rowid (SQLite's writer, for its
// cache).
const openWorkflowRowidQuery = selectWorkflows + `, w.rowid` + fromWorkflows + ` WHERE w.node_id = ? AND w.outcome_applied = ? ORDER BY w.created_at DESC LIMIT 1`

// rows is the writer's cache of open workflows (nil: none, on PostgreSQL).
func (t *Tx) rows() *workflowCache {
	if t.lc == nil {
		return nil
	}
	return t.lc.cache
}

// OpenWorkflow returns the node's workflow whose outcome the reconciler has not applied yet.
func (t *Tx) OpenWorkflow(ctx context.Context, nodeID string) (Workflow, bool, error) {
	rc := t.rows()
	if rc == nil {
		return scanOpenWorkflow(t.queryRow(ctx, openWorkflowQuery, nodeID, false), nodeID)
	}
	if w, open, cached := rc.workflow(nodeID); cached {
		return w, open, nil
	}
	var row int64
	w, ok, err := scanOpenWorkflow(withExtra{t.queryRow(ctx, openWorkflowRowidQuery, nodeID, false), []any{&row}}, nodeID)
	switch {
	case err != nil:
	case ok:
		rc.putWorkflow(w, row)
	default:
		rc.putNoWorkflow(nodeID)
	}
	return w, ok, err
}

// scanOpenWorkflow scans the row of openWorkflowQuery: the workflow, and false if there is none.
func scanOpenWorkflow(r rowScanner, nodeID string) (Workflow, bool, error) {
	w, err := scanWorkflow(r)
	if errors.Is(err, sql.ErrNoRows) {
		return Workflow{}, false, nil
	}
	if err != nil {
		return Workflow{}, false, fmt.Errorf("reading open workflow of %s: %w", nodeID, err)
	}
	return w, true, nil
}

// nodeWorkflowsQuery lists a node's workflows, newest first: found through workflows_node_open
// (by its node, whatever their outcome), and then sorted.
const nodeWorkflowsQuery = selectWorkflows + fromWorkflows + ` WHERE w.node_id = ? ORDER BY w.created_at DESC LIMIT ?`

// Workflows lists a node's workflows, newest first.
func (s *Store) Workflows(ctx context.Context, nodeID string, limit int) ([]Workflow, error) {
	rows, err := s.queryRows(ctx, nodeWorkflowsQuery, nodeID, limit)
	return collect(rows, err, "workflows", scanWorkflow)
}

// ---------------------------------------------------------------- commands

// Command is a unit of work relayed to an agent.
type Command struct {
	ID, NodeID, TenantID, SiteID, Kind, Subject, State string
	Args                                               string // JSON
	TargetAgent                                        string
	Attempts                                           int
	Result, Error                                      string
	WorkflowID                                         string
	StepIndex                                          int
	RunsOn                                             string
	Destructive, Attested, Reroutable                  bool
	Generation                                         uint64
	Deadline, DeliveredAt, FinishedAt                  int64
	Progress                                           string
	ResultSig, SignerCert                              []byte
	CreatedAt, UpdatedAt                               int64
	// BatchID is the batch whose scope must list the command's leaf (destructive kinds).
	BatchID string
}

const commandCols = `id, node_id, tenant_id, site_id, kind, subject, state, args, target_agent, attempts, result, error,
	workflow_id, step_index, runs_on, destructive, attested, reroutable, generation, deadline, delivered_at, finished_at,
	progress, result_sig, signer_cert, created_at, updated_at, batch_id`

func scanCommand(r interface{ Scan(...any) error }) (Command, error) {
	if sc := takeScratch(r); sc != nil {
		defer sc.release()
		err := scanCommandInto(r, &sc.cmd, &sc.cmdGen, sc.dst[:0])
		return sc.cmd, err // (copied out before the release)
	}
	var c Command
	var gen int64
	err := scanCommandInto(r, &c, &gen, nil)
	return c, err
}

// scanCommandInto scans a command's row into c, with gen and dst (reused: appended to from
// empty) for the scan's own use.
func scanCommandInto(r rowScanner, c *Command, gen *int64, dst []any) error {
	dst = append(dst, &c.ID, &c.NodeID, &c.TenantID, &c.SiteID, &c.Kind, &c.Subject, &c.State, &c.Args, &c.TargetAgent, &c.Attempts,
		&c.Result, &c.Error, &c.WorkflowID, &c.StepIndex, &c.RunsOn, &c.Destructive, &c.Attested, &c.Reroutable, gen,
		&c.Deadline, &c.DeliveredAt, &c.FinishedAt, &c.Progress, &c.ResultSig, &c.SignerCert, &c.CreatedAt, &c.UpdatedAt, &c.BatchID)
	err := r.Scan(dst...)
	c.Generation = uint64(*gen)
	return err
}

// InsertCommand queues a command.
func (t *Tx) InsertCommand(ctx context.Context, c *Command) error {
	c.ID = NewID(Micros(t.at))
	if c.State == "" {
		c.State = "queued"
	}
	c.CreatedAt, c.UpdatedAt = t.at, t.at
	if c.Args == "" {
		c.Args = "{}"
	}
	q := `INSERT INTO commands (` + commandCols + `) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`
	args := t.args(&c.ID, &c.NodeID, &c.TenantID, &c.SiteID, &c.Kind, &c.Subject, &c.State, &c.Args, &c.TargetAgent, &c.Attempts, &c.Result, &c.Error,
		&c.WorkflowID, &c.StepIndex, &c.RunsOn, &c.Destructive, &c.Attested, &c.Reroutable, &c.Generation, &c.Deadline,
		&c.DeliveredAt, &c.FinishedAt, &c.Progress, &c.ResultSig, &c.SignerCert, &c.CreatedAt, &c.UpdatedAt, &c.BatchID)
	rc := t.rows()
	if rc == nil {
		return t.execLater(ctx, "queueing command "+c.Kind+" for node "+c.NodeID, q, args...)
	}
	// SQLite's writer keeps the row it inserted: its agent's claim, acknowledgement and reports
	// then read it from memory (workflowCache.cmds).
	res, err := t.exec(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("queueing command %s for node %s: %w", c.Kind, c.NodeID, err)
	}
	row, err := res.LastInsertId()
	if err == nil {
		rc.putCommand(*c, row)
	}
	return nil
}

// commandRowQuery reads a command's row with its rowid (SQLite's writer, which caches it).
const commandRowQuery = `SELECT rowid, ` + commandCols + ` FROM commands WHERE id = ?`

// Command reads a command in the transaction. SQLite's writer takes it from its cache when it
// holds the row, and caches a row it reads.
func (t *Tx) Command(ctx context.Context, id string) (Command, error) {
	rc := t.rows()
	if c, ok := rc.command(id); ok {
		return c, nil
	}
	var c Command
	var err error
	var row int64
	if rc == nil {
		c, err = scanCommand(t.queryRow(ctx, `SELECT `+commandCols+` FROM commands WHERE id = ?`+t.forUpdate(), id))
	} else {
		var gen int64
		err = scanCommandInto(t.queryRow(ctx, commandRowQuery, id), &c, &gen, []any{&row})
	}
	if errors.Is(err, sql.ErrNoRows) {
		return Command{}, fmt.Errorf("command %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Command{}, fmt.Errorf("reading command %s: %w", id, err)
	}
	if rc != nil {
		rc.putCommand(c, row)
	}
	return c, nil
}

// Command reads a command.
func (s *Store) Command(ctx context.Context, id string) (Command, error) {
	c, err := scanCommand(s.queryRow(ctx, `SELECT `+commandCols+` FROM commands WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Command{}, fmt.Errorf("command %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Command{}, fmt.Errorf("reading command %s: %w", id, err)
	}
	return c, nil
}

// CountCommandsByState counts every command by its state.
func (s *Store) CountCommandsByState(ctx context.Context) (map[string]int, error) {
	return s.countBy(ctx, `SELECT state, COUNT(*) FROM commands GROUP BY state`, "commands per state")
}

// Commands lists commands of a node (or all when nodeID is empty), oldest first. A node's are
// found through commands_node (one statement for both, whose condition named the empty node id
// too, scanned the table).
func (s *Store) Commands(ctx context.Context, nodeID string, limit int) ([]Command, error) {
	q, args := `SELECT `+commandCols+` FROM commands ORDER BY created_at, id LIMIT ?`, []any{limit}
	if nodeID != "" {
		q, args = nodeCommandsQuery, []any{nodeID, limit}
	}
	rows, err := s.queryRows(ctx, q, args...)
	return collect(rows, err, "commands", scanCommand)
}

// NodeCommands lists a node's commands, of one workflow when workflowID is set, newest first.
func (s *Store) NodeCommands(ctx context.Context, nodeID, workflowID string, limit int) ([]Command, error) {
	q, args := `SELECT `+commandCols+` FROM commands WHERE node_id = ?`, []any{nodeID}
	if workflowID != "" {
		q, args = q+` AND workflow_id = ?`, append(args, workflowID)
	}
	rows, err := s.queryRows(ctx, q+` ORDER BY created_at DESC, id DESC LIMIT ?`, append(args, limit)...)
	return collect(rows, err, "commands of a node", scanCommand)
}

// nodeCommandsQuery lists a node's commands, oldest first (arguments: the node, a limit).
const nodeCommandsQuery = `SELECT ` + commandCols + ` FROM commands WHERE node_id = ? ORDER BY created_at, id LIMIT ?`

// AttestedResults lists the node's succeeded commands of the given attested kinds, newest first.
func (s *Store) AttestedResults(ctx context.Context, nodeID string, kinds []string, limit int) ([]Command, error) {
	in, args := inList(kinds)
	args = append([]any{nodeID}, append(args, true, "succeeded", limit)...)
	rows, err := s.queryRows(ctx, `SELECT `+commandCols+` FROM commands WHERE node_id = ? AND kind IN `+in+` AND attested = ? AND state = ?
		ORDER BY created_at DESC, id DESC LIMIT ?`, args...)
	return collect(rows, err, "attested results", scanCommand)
}

// UpdateCommand writes a command's state and outcome as the control plane decided them. A
// command it fails while an agent holds it acknowledged (delivered or running, as the row
// stands) is one given up under the agent (an aborted workflow, a step out of time), which the
// agent may still be running: the same write records that the agent is to be told to cancel it
// (cancel_requested_at; PendingCancels), whichever server holds the agent's connection. An
// agent's own report goes through ReportCommand.
func (t *Tx) UpdateCommand(ctx context.Context, c *Command) error {
	// Only a failure under its agent requests a cancel: '' matches no holder.
	holder := ""
	if c.State == "failed" {
		holder = c.TargetAgent
	}
	c.UpdatedAt = t.at
	return t.execLater(ctx, "updating command "+c.ID, `UPDATE commands SET state = ?, target_agent = ?, attempts = ?, result = ?, error = ?, delivered_at = ?,
		finished_at = ?, progress = ?, result_sig = ?, signer_cert = ?, updated_at = ?,
		cancel_requested_at = CASE WHEN state IN ('delivered', 'running') AND target_agent <> '' AND target_agent = ? THEN ? ELSE cancel_requested_at END
		WHERE id = ?`,
		c.State, c.TargetAgent, c.Attempts, c.Result, c.Error, c.DeliveredAt, c.FinishedAt, c.Progress, c.ResultSig, c.SignerCert, c.UpdatedAt,
		holder, t.at, c.ID)
}

// ReportCommand writes an agent's report on its command (its state, progress and outcome), as
// UpdateCommand does without requesting a cancel: the agent itself ended it.
func (t *Tx) ReportCommand(ctx context.Context, c *Command) error {
	c.UpdatedAt = t.at
	rc := t.rows()
	e, known := rc.takeCommand(c.ID)
	args := t.args(&c.State, &c.TargetAgent, &c.Attempts, &c.Result, &c.Error, &c.DeliveredAt, &c.FinishedAt, &c.Progress, &c.ResultSig, &c.SignerCert, &c.UpdatedAt)
	if known {
		// (SQLite's writer, which knows the row)
		if _, err := t.updateByRow(ctx, reportCommand+` WHERE id = ?`, reportCommand+` WHERE rowid = ? AND id = ?`, e.row, args, &c.ID); err != nil {
			return fmt.Errorf("recording the report on command %s: %w", c.ID, err)
		}
	} else if err := t.execLater(ctx, "recording the report on command "+c.ID, reportCommand+` WHERE id = ?`, append(args, c.ID)...); err != nil {
		return err
	}
	if known && !command.State(c.State).Final() {
		// The cached row (which exists: a deleted one leaves the cache) with what the statement
		// set; an ended command is not read again in the writer, and leaves the cache.
		n := &e.c
		n.State, n.TargetAgent, n.Attempts, n.Result, n.Error, n.DeliveredAt = c.State, c.TargetAgent, c.Attempts, c.Result, c.Error, c.DeliveredAt
		n.FinishedAt, n.Progress, n.UpdatedAt = c.FinishedAt, c.Progress, c.UpdatedAt
		n.ResultSig, n.SignerCert = slices.Clone(c.ResultSig), slices.Clone(c.SignerCert)
		rc.restoreCommand(e)
	}
	return nil
}

// reportCommand is ReportCommand's statement, without its condition.
const reportCommand = `UPDATE commands SET state = ?, target_agent = ?, attempts = ?, result = ?, error = ?, delivered_at = ?,
		finished_at = ?, progress = ?, result_sig = ?, signer_cert = ?, updated_at = ?`

// UpdateCommandIf writes c as UpdateCommand does, provided the row is still as was read
// outside the writer (was): same state, agent and times. It reports false, writing nothing, when
// the row changed since.
func (t *Tx) UpdateCommandIf(ctx context.Context, c *Command, was Command) (bool, error) {
	updated := t.at
	q, args := updateCommandIf(c, was, updated)
	res, err := t.exec(ctx, q, args...)
	if err != nil {
		return false, fmt.Errorf("updating command %s: %w", c.ID, err)
	}
	n, err := res.RowsAffected()
	if err != nil || n != 1 {
		return false, err
	}
	c.UpdatedAt = updated
	return true, nil
}

// updateCommandIf is UpdateCommandIf's statement, its row updated at the given time.
func updateCommandIf(c *Command, was Command, updated int64) (string, []any) {
	return `UPDATE commands SET state = ?, target_agent = ?, attempts = ?, result = ?, error = ?, delivered_at = ?,
		finished_at = ?, progress = ?, result_sig = ?, signer_cert = ?, updated_at = ? WHERE id = ?
		AND state = ? AND target_agent = ? AND updated_at = ? AND delivered_at = ? AND finished_at = ?`,
		[]any{c.State, c.TargetAgent, c.Attempts, c.Result, c.Error, c.DeliveredAt, c.FinishedAt, c.Progress, c.ResultSig, c.SignerCert, updated, c.ID,
			was.State, was.TargetAgent, was.UpdatedAt, was.DeliveredAt, was.FinishedAt}
}

// Acknowledger is the agent whose acknowledgements DeliverCommands records: a site agent by
// its id, or a node agent (Node) by its id and identity generation, and the node it runs on.
type Acknowledger struct {
	AgentID    string
	Node       bool
	NodeID     string
	Generation uint64
}

// DeliverCommands marks the queued commands of ids assigned to by (of its generation, for a
// node agent) delivered (their agent acknowledged them) and returns those it marked. A node
// agent's claim assigns nothing (Engine.Claim): its acknowledgement also takes the unassigned
// ramdisk commands of its node and generation, assigning them to it (an attempt each). An id
// left out is not both (delivered already, another agent's or generation's, or unknown): the
// caller reads it to tell which.
func (t *Tx) DeliverCommands(ctx context.Context, ids []string, by Acknowledger) (map[string]bool, error) {
	agentID := by.AgentID
	// As in AssignCommands: SQLite reads the rows by id, not through an index on the agent.
	plus := ""
	if t.s.engine == SQLite {
		plus = "+"
	}
	// A node agent's id names the node, not its identity generation: the generation keeps a
	// revoked generation's agent from acknowledging the new one's commands.
	genCond, genArgs := "", []any(nil)
	if by.Node {
		genCond, genArgs = ` AND generation = ?`, []any{int64(by.Generation)}
	}
	// Whose: the agent's; for a node agent, also its node's unassigned ramdisk commands.
	take, whose, whoseArgs := "", plus+`target_agent = ?`, []any{agentID}
	if by.Node && by.NodeID != "" {
		take = `, target_agent = ?, attempts = attempts + CASE WHEN target_agent = '' THEN 1 ELSE 0 END`
		whose = `(` + plus + `target_agent = ? OR ` + plus + `target_agent = '' AND ` + plus + `runs_on = 'ramdisk' AND ` + plus + `node_id = ?)`
		whoseArgs = []any{agentID, by.NodeID}
	}
	done := map[string]bool{}
	rc := t.rows()
	// delivered caches the row of command id as the statement left it, from the row before.
	delivered := func(taken map[string]*cachedCommand, id string) {
		done[id] = true
		e, ok := taken[id]
		if !ok {
			return
		}
		delete(taken, id)
		c := &e.c
		c.State, c.DeliveredAt, c.UpdatedAt = "delivered", t.at, t.at
		if take != "" {
			c.Attempts += assignAttempt(c.TargetAgent)
			c.TargetAgent = agentID
		}
		rc.restoreCommand(e)
	}
	for i := 0; i < len(ids); i += idsPerStatement {
		chunk := ids[i:min(i+idsPerStatement, len(ids))]
		taken := rc.takeCommands(chunk)
		err := inRows(chunk, taken, func(in string, inArgs []any, chunk []string) ([]string, error) {
			set := `UPDATE ` + t.s.orFail() + `commands SET state = 'delivered', delivered_at = ?, updated_at = ?` + take + `
			WHERE ` + in + ` AND ` + whose + ` AND ` + plus + `state = 'queued'` + genCond
			args := []any{t.at, t.at}
			if take != "" {
				args = append(args, agentID)
			}
			args = append(append(append(args, inArgs...), whoseArgs...), genArgs...)
			if len(chunk) == 1 && t.s.engine == SQLite {
				// One command: without RETURNING (see AssignCommands).
				ok, err := t.execOne(ctx, set, args)
				if err != nil || !ok {
					return nil, err
				}
				delivered(taken, chunk[0])
				return chunk, nil
			}
			rows, err := t.query(ctx, set+` RETURNING id`, args...)
			marked, err := collect(rows, err, "delivered commands", scanID)
			if err != nil {
				return nil, err
			}
			for _, id := range marked {
				delivered(taken, id)
			}
			return marked, nil
		})
		if err != nil {
			return nil, fmt.Errorf("recording delivery of %d commands to %s: %w", len(ids), agentID, err)
		}
		rc.restoreUnchanged(taken)
	}
	return done, nil
}

// idAttempts is a command assigned by AssignCommands and its attempts.
type idAttempts struct {
	id       string
	attempts int
}

// idsPerStatement bounds the ids of one IN list.
const idsPerStatement = 256

// inRows runs stmt on the commands ids (at most idsPerStatement), its condition in "id IN (…)"
// with inArgs; or, where the writer's cache holds every one of them (taken), "rowid IN (…) AND
// +id IN (…)": SQLite then finds each row through the table's b-tree alone, not first through
// the index of the ids (see updateByRow), and still checks the ids. stmt returns the ids it
// changed. stmt runs again by id for those it did not change by rowid (their entries out of
// taken meanwhile): that changes what a rowid the cache got wrong (its invariant rules that out)
// kept from it, whose entry then leaves the cache, and nothing a run by id alone would not have;
// the entries of the rows it left as they were go back to taken.
func inRows(ids []string, taken map[string]*cachedCommand, stmt func(in string, inArgs []any, ids []string) ([]string, error)) error {
	list, args := inList(ids)
	if len(taken) != len(ids) {
		_, err := stmt("id IN "+list, args, ids)
		return err
	}
	rowArgs := make([]any, len(args), 2*len(args))
	for j := range args {
		rowArgs[j] = taken[args[j].(string)].row
	}
	changed, err := stmt("rowid IN "+list+" AND +id IN "+list, append(rowArgs, args...), ids)
	if err != nil || len(changed) == len(ids) {
		return err
	}
	done := make(map[string]bool, len(changed))
	for _, id := range changed {
		done[id] = true
	}
	var rest []string
	unchanged := map[string]*cachedCommand{}
	for _, id := range ids {
		if !done[id] {
			rest = append(rest, id)
			unchanged[id] = taken[id]
			delete(taken, id)
		}
	}
	list, args = inList(rest)
	again, err := stmt("id IN "+list, args, rest)
	if err != nil {
		return err
	}
	for _, id := range again {
		delete(unchanged, id) // (its entry's rowid was not its row's: the entry goes)
	}
	maps.Copy(taken, unchanged) // (left as they were: put back by the caller)
	return nil
}

// inList is an IN list of ids with its arguments, padded to a power of two with the last id so
// that a few statements (prepared once) serve every size. ids must not be empty.
func inList(ids []string) (string, []any) {
	size := 1
	for size < len(ids) {
		size *= 2
	}
	args := make([]any, size)
	for j := range size {
		args[j] = ids[min(j, len(ids)-1)]
	}
	return "(?" + strings.Repeat(", ?", size-1) + ")", args
}

// ClaimCommands assigns to agent up to limit commands it should run: first those already
// assigned to it and not acknowledged (a reconnect), then unassigned queued ones it may take
// (site commands of its site; the ramdisk commands of its node at its generation). Unassigned
// commands of holderKinds go only to the site's boot-lease holder while another agent's lease
// runs (to any agent of the site when nobody holds it).
func (t *Tx) ClaimCommands(ctx context.Context, agentID, kind, siteID, nodeID string, generation uint64, limit int, holderKinds ...string) ([]Command, error) {
	return t.ClaimNewCommands(ctx, agentID, kind, siteID, nodeID, generation, limit, nil, 0, holderKinds...)
}

// ClaimNewCommands is ClaimCommands for an agent that was already offered some of its assigned
// commands on its connection (offered says which, sent how many): up to limit commands it was
// not offered are returned (unassigned commands were never offered, so no more of them are read
// than the limit leaves). Its assigned commands are read as ids, and whole only those it was not
// offered: a site agent's claim otherwise read again, whole, every command it had been offered
// and not yet acknowledged (95 % of the rows its claims read over the gateway, 1 000 nodes).
func (t *Tx) ClaimNewCommands(ctx context.Context, agentID, kind, siteID, nodeID string, generation uint64, limit int, offered func(id string) bool, sent int, holderKinds ...string) ([]Command, error) {
	cands, err := t.s.claimCandidates(ctx, t.query, t.at, agentID, kind, siteID, nodeID, generation, limit, true, offered, sent, holderKinds)
	if err != nil {
		return nil, err
	}
	return t.AssignCommands(ctx, agentID, cands, holderKinds...)
}

// CommandCandidates reads, outside any write transaction, the commands ClaimNewCommands would
// consider for the agent: a snapshot that may be a moment old, so AssignCommands takes them in
// the writer only where they are still the agent's to take. An agent that finds none never
// enters the writer. With assigned false only unassigned commands are read: the caller knows
// that every command assigned to the agent was offered on its connection, or looked for them
// a moment ago (Engine.Claim).
func (s *Store) CommandCandidates(ctx context.Context, agentID, kind, siteID, nodeID string, generation uint64, limit int, assigned bool, offered func(id string) bool, sent int, holderKinds ...string) ([]Command, error) {
	query, done := s.hotQuery()
	defer done()
	return s.claimCandidates(ctx, query, s.nowMicros(), agentID, kind, siteID, nodeID, generation, limit, assigned, offered, sent, holderKinds)
}

func (s *Store) claimCandidates(ctx context.Context, query func(ctx context.Context, q string, args ...any) (rowsIter, error), at int64,
	agentID, kind, siteID, nodeID string, generation uint64, limit int, assigned bool, offered func(id string) bool, sent int, holderKinds []string) ([]Command, error) {
	from, args, err := claimQuery(agentID, kind, siteID, nodeID, generation, at, holderKinds)
	if err != nil {
		return nil, err
	}
	q, idsQ := `SELECT `+commandCols+` `+from, `SELECT id `+from
	var out []Command
	fresh := 0 // commands returned that were not offered before
	targets := []string{agentID, ""}
	if !assigned {
		targets = targets[1:]
	}
	for _, target := range targets {
		want := limit - fresh
		if target != "" {
			want += sent
		}
		if want <= 0 {
			break
		}
		if target != "" && offered != nil {
			cs, err := unofferedAssigned(ctx, query, idsQ, append(append([]any{}, args...), target, want), offered, limit)
			if err != nil {
				return nil, fmt.Errorf("claiming commands for %s: %w", agentID, err)
			}
			out, fresh = append(out, cs...), len(cs)
			continue
		}
		rows, err := query(ctx, q, append(append([]any{}, args...), target, want)...)
		if err != nil {
			return nil, fmt.Errorf("claiming commands for %s: %w", agentID, err)
		}
		for rows.Next() {
			c, err := scanCommand(rows)
			if err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, c)
			if offered == nil || !offered(c.ID) {
				fresh++
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// unofferedAssigned runs the claim query q for ids alone (with its arguments, the agent's id and
// the limit), and reads whole the commands among them that were not offered (up to limit), still
// queued, oldest first.
func unofferedAssigned(ctx context.Context, query func(ctx context.Context, q string, args ...any) (rowsIter, error), q string, args []any, offered func(id string) bool, limit int) ([]Command, error) {
	rows, err := query(ctx, q, args...)
	assigned, err := collect(rows, err, "assigned commands", scanID)
	if err != nil {
		return nil, err
	}
	ids := slices.DeleteFunc(assigned, offered)
	ids = ids[:min(len(ids), limit)]
	var out []Command
	for len(ids) > 0 {
		in, inArgs := inList(ids[:min(len(ids), idsPerStatement)])
		ids = ids[min(len(ids), idsPerStatement):]
		rows, err := query(ctx, `SELECT `+commandCols+` FROM commands WHERE id IN `+in+` AND state = 'queued' ORDER BY created_at`, inArgs...)
		cs, err := collect(rows, err, "assigned commands", scanCommand)
		if err != nil {
			return nil, err
		}
		out = append(out, cs...)
	}
	return out, nil
}

// claimQuery is the query of an agent's claim candidates from its FROM on (the caller selects
// the columns), with its arguments but the last two: the target agent ("" for unassigned
// commands) and the limit.
func claimQuery(agentID, kind, siteID, nodeID string, generation uint64, at int64, holderKinds []string) (string, []any, error) {
	var where string
	var args []any
	switch kind {
	case "site":
		where, args = `runs_on = 'site' AND site_id = ?`, []any{siteID}
		if cond, cargs := holderCondition(agentID, at, holderKinds); cond != "" {
			where += ` AND (target_agent <> '' OR ` + cond + `)`
			args = append(args, cargs...)
		}
	case "node":
		where, args = `runs_on = 'ramdisk' AND node_id = ? AND generation = ?`, []any{nodeID, int64(generation)}
	default:
		return "", nil, fmt.Errorf("agent kind %q cannot run commands", kind)
	}
	// First the commands already assigned to the agent (a reconnect), then unassigned ones,
	// each oldest first: two range scans of commands_claim_site or commands_claim_ramdisk
	// (both end with created_at) that stop at the limit. A ramdisk's index and PostgreSQL's
	// site index hold the agent in their key, so each scan reads its own commands alone;
	// SQLite's site index does not (migration 00052), so a scan there reads past the site's
	// other queued commands too: the free scan past those assigned and not yet acknowledged (at
	// the queue's front), the assigned scan past the free ones.
	return `FROM commands WHERE state = 'queued' AND ` + where + ` AND target_agent = ?
		ORDER BY created_at LIMIT ?`, args, nil
}

// holderCondition is the SQL condition (with its arguments) under which a free command may go to
// agentID at time at: it is not of holderKinds, or no other agent holds the site's boot lease.
// "" when there are no holderKinds.
func holderCondition(agentID string, at int64, holderKinds []string) (string, []any) {
	if len(holderKinds) == 0 {
		return "", nil
	}
	args := make([]any, 0, len(holderKinds)+2)
	for _, k := range holderKinds {
		args = append(args, k)
	}
	return `kind NOT IN (?` + strings.Repeat(`, ?`, len(holderKinds)-1) + `)
		OR NOT EXISTS (SELECT 1 FROM leases WHERE leases.site_id = commands.site_id AND holder <> '' AND holder <> ? AND expires_at > ?)`,
		append(args, agentID, at)
}

// AssignCommands takes for agentID those of cands that are still queued and either assigned to
// it already or free (free commands of holderKinds only while no other agent holds the site's
// boot lease), many per statement, and returns them as taken (a free one counts an attempt).
// Candidates that meanwhile went to another agent, were withdrawn or finished are left out:
// only what the statement returns is the agent's.
func (t *Tx) AssignCommands(ctx context.Context, agentID string, cands []Command, holderKinds ...string) ([]Command, error) {
	took := map[string]int{} // attempts, by id
	// SQLite would otherwise read the rows through an index on the two columns (every queued
	// command) rather than by id: unary + keeps them out of the index choice.
	plus := ""
	if t.s.engine == SQLite {
		plus = "+"
	}
	holder, holderArgs := holderCondition(agentID, t.at, holderKinds)
	if holder != "" {
		holder = ` AND (` + holder + `)`
	}
	rc := t.rows()
	for i := 0; i < len(cands); i += idsPerStatement {
		chunk := cands[i:min(i+idsPerStatement, len(cands))]
		ids := make([]string, len(chunk))
		for j, c := range chunk {
			ids[j] = c.ID
		}
		taken := rc.takeCommands(ids)
		err := inRows(ids, taken, func(in string, inArgs []any, ids []string) ([]string, error) {
			args := append(append([]any{agentID, t.at}, inArgs...), agentID)
			args = append(args, holderArgs...)
			set := `UPDATE ` + t.s.orFail() + `commands SET target_agent = ?, attempts = attempts + CASE WHEN target_agent = '' THEN 1 ELSE 0 END, updated_at = ?
			WHERE ` + in + ` AND ` + plus + `state = 'queued'
			AND (` + plus + `target_agent = ? OR ` + plus + `target_agent = ''` + holder + `)`
			if len(ids) == 1 && t.s.engine == SQLite {
				// One command (most claims): SQLite's RETURNING builds two temporary tables,
				// each with a page cache of its own, which cost more than reading the row again
				// (or taking it from the cache).
				attempts, ok, err := t.assignOne(ctx, set, args, ids[0], taken[ids[0]])
				if err != nil || !ok {
					return nil, err
				}
				took[ids[0]] = attempts
				rc.restoreAssigned(taken, ids[0], agentID, attempts, t.at)
				return ids, nil
			}
			rows, err := t.query(ctx, set+` RETURNING id, attempts`, args...)
			assigned, err := collect(rows, err, "assigned commands", func(r interface{ Scan(...any) error }) (idAttempts, error) {
				var a idAttempts
				return a, r.Scan(&a.id, &a.attempts)
			})
			if err != nil {
				return nil, err
			}
			changed := make([]string, len(assigned))
			for k, a := range assigned {
				took[a.id] = a.attempts
				rc.restoreAssigned(taken, a.id, agentID, a.attempts, t.at)
				changed[k] = a.id
			}
			return changed, nil
		})
		if err != nil {
			return nil, fmt.Errorf("assigning commands to %s: %w", agentID, err)
		}
		rc.restoreUnchanged(taken)
	}
	claimed := make([]Command, 0, len(took))
	for _, c := range cands {
		attempts, ok := took[c.ID]
		if !ok {
			continue
		}
		c.TargetAgent, c.Attempts, c.State, c.UpdatedAt = agentID, attempts, "queued", t.at
		claimed = append(claimed, c)
		delete(took, c.ID) // a candidate listed twice is returned once
	}
	return claimed, nil
}

// assignAttempt is the attempt an assignment counts for a command assigned to agent target
// before it: one when it was free (AssignCommands' and DeliverCommands' statements). Pure.
func assignAttempt(target string) int {
	if target == "" {
		return 1
	}
	return 0
}

// assignOne runs AssignCommands' statement set for the one command id, without RETURNING,
// and returns the command's attempts when it was assigned: computed as the statement does from
// was, the row before as the writer's cache held it, else read.
func (t *Tx) assignOne(ctx context.Context, set string, args []any, id string, was *cachedCommand) (attempts int, ok bool, err error) {
	if ok, err = t.execOne(ctx, set, args); err != nil || !ok {
		return 0, false, err
	}
	if was != nil {
		return was.c.Attempts + assignAttempt(was.c.TargetAgent), true, nil
	}
	return attempts, true, t.queryRow(ctx, `SELECT attempts FROM commands WHERE id = ?`, id).Scan(&attempts)
}

// execOne runs an UPDATE of one row by id and reports whether it changed the row.
func (t *Tx) execOne(ctx context.Context, q string, args []any) (bool, error) {
	res, err := t.exec(ctx, q, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// ---------------------------------------------------------------- agents

// Agent is a connected (or once connected) agent.
type Agent struct {
	ID, Kind, SiteID, NodeID string
	// ConnID names one connection: a departure reported late for an older connection of the
	// same agent must not mark the newer one gone.
	ConnID                string
	Generation            uint64
	Connected             bool
	ConnectedAt, LastSeen int64
	Version               string
	// ServerID is the server the connection is to (its engine's id).
	ServerID string
	// CertRenewAt and CertNotAfter: when the agent's certificate is due for renewal and when
	// it expires (microseconds; 0: not known).
	CertRenewAt, CertNotAfter int64
	// DHCPMode and BootBinding: what a site agent last reported of its boot services ("" before
	// it did; SiteAgents reads them).
	DHCPMode, BootBinding string
	// Cache is what a site agent last reported of its artifact cache (zero before it did).
	Cache ArtifactCache
	// CAs is what the agent said of its CAs as it connected (UpsertAgent; nil: nothing).
	CAs *AgentCAs
}

// ArtifactCache is a site agent's artifact cache as it reported it: artifacts and bytes held,
// its bound (0: none), and the evictions since the agent started.
type ArtifactCache struct {
	Artifacts    int64 `json:"artifacts"`
	Bytes        int64 `json:"bytes"`
	Bound        int64 `json:"bound"`
	Evictions    int64 `json:"evictions"`
	EvictedBytes int64 `json:"evictedBytes"`
}

// SetAgentArtifactCache records what site agent id reports of its artifact cache.
func (t *Tx) SetAgentArtifactCache(ctx context.Context, id string, c ArtifactCache) error {
	b, _ := json.Marshal(c)
	if _, err := t.exec(ctx, `UPDATE agents SET artifact_cache = ? WHERE id = ?`, string(b), id); err != nil {
		return fmt.Errorf("recording the artifact cache of agent %s: %w", id, err)
	}
	return nil
}

// SetAgentBootServices records what site agent id reports of its boot services: its DHCP mode
// and boot binding.
func (t *Tx) SetAgentBootServices(ctx context.Context, id, dhcpMode, binding string) error {
	if _, err := t.exec(ctx, `UPDATE agents SET dhcp_mode = ?, boot_binding = ? WHERE id = ?`, dhcpMode, binding, id); err != nil {
		return fmt.Errorf("recording the boot services of agent %s: %w", id, err)
	}
	return nil
}

// UpsertAgent records agent a's connection, with what it said of its CAs (a.CAs; nil: nothing
// said): one write per connection.
func (t *Tx) UpsertAgent(ctx context.Context, a Agent) error {
	var trusted, issuer string
	var reportedAt int64
	if a.CAs != nil {
		if err := a.CAs.Check(); err != nil {
			return fmt.Errorf("recording agent %s: %w", a.ID, err)
		}
		trusted, issuer, reportedAt = strings.Join(a.CAs.Trusted, ","), a.CAs.Issuer, t.at
	}
	_, err := t.exec(ctx, `INSERT INTO agents (id, kind, site_id, node_id, generation, connected, connected_at, last_seen, version, conn_id, server_id, cert_renew_at, cert_not_after,
		trusted_cas, issuer_ca, ca_reported_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET generation = excluded.generation, connected = excluded.connected,
		connected_at = excluded.connected_at, last_seen = excluded.last_seen, conn_id = excluded.conn_id, server_id = excluded.server_id, reaped_at = 0,
		version = CASE WHEN excluded.version = '' THEN agents.version ELSE excluded.version END,
		cert_renew_at = excluded.cert_renew_at, cert_not_after = excluded.cert_not_after,
		trusted_cas = excluded.trusted_cas, issuer_ca = excluded.issuer_ca, ca_reported_at = excluded.ca_reported_at`,
		a.ID, a.Kind, a.SiteID, a.NodeID, int64(a.Generation), true, t.at, t.at, a.Version, a.ConnID, a.ServerID, a.CertRenewAt, a.CertNotAfter,
		trusted, issuer, reportedAt)
	if err != nil {
		return fmt.Errorf("recording agent %s: %w", a.ID, err)
	}
	return nil
}

// RevokeSiteAgent records that site agent id's certificate is refused from now on, and returns
// the agent (ErrNotFound: no site agent of that id ever connected).
func (t *Tx) RevokeSiteAgent(ctx context.Context, id string) (Agent, error) {
	res, err := t.exec(ctx, `UPDATE agents SET revoked_at = ? WHERE id = ? AND kind = 'site' AND revoked_at = 0`, t.at, id)
	if err != nil {
		return Agent{}, fmt.Errorf("revoking site agent %s: %w", id, err)
	}
	var a Agent
	var revoked int64
	err = t.queryRow(ctx, `SELECT id, site_id, revoked_at FROM agents WHERE id = ? AND kind = 'site'`, id).Scan(&a.ID, &a.SiteID, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return Agent{}, fmt.Errorf("site agent %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Agent{}, fmt.Errorf("revoking site agent %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return a, fmt.Errorf("site agent %s was revoked already: %w", id, ErrConflict)
	}
	return a, nil
}

// SiteAgentRevoked says whether site agent id's certificate was revoked (an agent never seen
// is not: it joined with a token and connects for the first time).
func (s *Store) SiteAgentRevoked(ctx context.Context, id string) (bool, error) {
	var revoked int64
	err := s.queryRow(ctx, `SELECT revoked_at FROM agents WHERE id = ? AND kind = 'site'`, id).Scan(&revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading whether site agent %s is revoked: %w", id, err)
	}
	return revoked > 0, nil
}

// AgentCertificate records an agent's renewed certificate: when it is due for renewal and when
// it expires (microseconds).
func (t *Tx) AgentCertificate(ctx context.Context, id string, renewAt, notAfter int64) error {
	if _, err := t.exec(ctx, `UPDATE agents SET cert_renew_at = ?, cert_not_after = ? WHERE id = ?`, renewAt, notAfter, id); err != nil {
		return fmt.Errorf("recording agent %s's certificate: %w", id, err)
	}
	return nil
}

// AgentSeen refreshes a connected agent's liveness.
func (t *Tx) AgentSeen(ctx context.Context, id, connID string) error {
	if _, err := t.exec(ctx, `UPDATE agents SET last_seen = ? WHERE id = ? AND conn_id = ? AND connected = ?`, t.at, id, connID, true); err != nil {
		return fmt.Errorf("recording that agent %s is alive: %w", id, err)
	}
	return nil
}

// AgentGone records the end of one connection of an agent (ignored when a newer connection of
// the same agent exists).
func (t *Tx) AgentGone(ctx context.Context, id, connID string) error {
	_, err := t.exec(ctx, `UPDATE agents SET connected = ?, last_seen = ? WHERE id = ? AND conn_id = ?`, false, t.at, id, connID)
	if err != nil {
		return fmt.Errorf("recording departure of agent %s: %w", id, err)
	}
	return nil
}

// PendingMark is what the result of a bmc.bios command that wrote settings, or of a bmc.firmware
// that installed an image, holds (the JSON of bmc.BIOSWriteResult or bmc.FirmwareUpdateResult
// with Pending set; a test pins them together).
const PendingMark = `"pending":true`

// LastBootCommandAt returns when the node was last sent a command that makes it boot or leave
// its ramdisk (a BMC power action, a kexec, or a lingering ramdisk's power-off once its ramdisk
// took it: acknowledged, which assigns a node agent's command), or 0: an agent connection older than that belongs to a previous boot even while the
// connection still looks alive (a reset machine sends no FIN). A bmc.bios that wrote settings
// and a bmc.firmware that installed an image count too: they apply at the next reset, so the
// ramdisk up before them must not be used as it is.
func (t *Tx) LastBootCommandAt(ctx context.Context, nodeID string) (int64, error) {
	var at int64
	err := t.queryRow(ctx, `SELECT COALESCE(MAX(created_at), 0) FROM commands WHERE node_id = ?
		AND (kind IN ('bmc.power', 'boot.kexec') OR kind = 'ramdisk.powerOff' AND target_agent <> ''
			OR kind IN ('bmc.bios', 'bmc.firmware') AND result LIKE '%`+PendingMark+`%')`, nodeID).Scan(&at)
	if err != nil {
		return 0, fmt.Errorf("reading the last boot command of %s: %w", nodeID, err)
	}
	return at, nil
}

// NodeAgentConnectedSince returns when the node's agent (ramdisk or OS, kind) at generation
// last connected, or 0.
func (t *Tx) NodeAgentConnectedSince(ctx context.Context, nodeID, kind string, generation uint64) (int64, error) {
	var at int64
	err := t.queryRow(ctx, `SELECT COALESCE(MAX(connected_at), 0) FROM agents WHERE node_id = ? AND kind = ? AND generation = ? AND connected = ?`,
		nodeID, kind, int64(generation), true).Scan(&at)
	if err != nil {
		return 0, fmt.Errorf("reading when the %s agent of %s connected: %w", kind, nodeID, err)
	}
	return at, nil
}

// NodeAgentGone reports whether the node has no agent of kind at generation connected, nor one
// seen at or after since (a reaped agent counts as unseen).
func (t *Tx) NodeAgentGone(ctx context.Context, nodeID, kind string, generation uint64, since int64) (bool, error) {
	var n int
	err := t.queryRow(ctx, `SELECT COUNT(*) FROM agents WHERE node_id = ? AND kind = ? AND generation = ? AND (connected = ? OR (last_seen >= ? AND reaped_at = 0))`,
		nodeID, kind, int64(generation), true, since).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("reading the %s agents of %s: %w", kind, nodeID, err)
	}
	return n == 0, nil
}

// nodeWaitingForRamdiskQuery finds a ramdisk agent's node that has a command queued for its
// ramdisk (commands_claim_ramdisk).
const nodeWaitingForRamdiskQuery = `SELECT a.node_id FROM agents a WHERE a.id = ? AND a.kind = 'node' AND EXISTS (
	SELECT 1 FROM commands c WHERE c.node_id = a.node_id AND c.generation = a.generation AND c.state = 'queued' AND c.runs_on = 'ramdisk')`

// NodeWaitingForRamdisk returns the node of a departed ramdisk agent when a command of the
// node's ramdisk (of the agent's generation) is still queued, else "".
func (t *Tx) NodeWaitingForRamdisk(ctx context.Context, agentID string) (string, error) {
	var node string
	err := t.queryRow(ctx, nodeWaitingForRamdiskQuery, agentID).Scan(&node)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("looking for commands waiting for ramdisk agent %s: %w", agentID, err)
	}
	return node, nil
}

// agentActiveQuery reads an agent's unfinished commands (commands_agent_active).
const agentActiveQuery = `SELECT ` + commandCols + ` FROM commands WHERE target_agent = ? AND ` + agentActiveCond

// agentActiveCond is an agent's unfinished commands: commands_agent_active's condition, which
// a query must repeat for SQLite to use the index (migration 00051: unfinished, finished_at 0),
// and the three states themselves (equalities, not an IN list: migration 00045).
const agentActiveCond = `target_agent <> '' AND finished_at = 0 AND (state = 'queued' OR state = 'delivered' OR state = 'running')`

// ReleaseAgentCommands applies an agent's departure to its unfinished commands: unacknowledged
// reroutable ones are released for another agent; acknowledged ones are lost (decide says
// which, for each command as read). Each command is written only if its row is still as read
// (UpdateCommandIf): on PostgreSQL an acknowledgement or a report of the agent, back on
// another connection, may commit between the read and the write, and must not be overwritten
// (a command released after its agent acknowledged it could run twice). Returns the commands
// as written: their nodes' reconcilers must look again.
func (t *Tx) ReleaseAgentCommands(ctx context.Context, agentID string, decide func(c Command) (next string, release bool)) (applied []Command, err error) {
	rows, err := t.query(ctx, agentActiveQuery, agentID)
	if err != nil {
		return nil, fmt.Errorf("reading commands of agent %s: %w", agentID, err)
	}
	var cmds []Command
	for rows.Next() {
		c, err := scanCommand(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		cmds = append(cmds, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		// A departure applied to part of the agent's commands would be marked reaped
		// (MarkAgentReaped) and never looked at again.
		return nil, fmt.Errorf("reading commands of agent %s: %w", agentID, err)
	}
	for _, was := range cmds {
		c := was
		next, release := decide(c)
		if next == c.State && !release {
			continue
		}
		if release {
			c.TargetAgent = ""
		}
		if next != c.State {
			c.State = next
			c.FinishedAt = t.at
			c.Error = "agent " + agentID + " went away after acknowledging the command; it is never sent twice"
		}
		ok, err := t.UpdateCommandIf(ctx, &c, was)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue // its agent acted on it since it was read: it is back
		}
		applied = append(applied, c)
	}
	return applied, nil
}

// ---------------------------------------------------------------- inventory

// StoredInventory is a node's inventory as its ramdisk last reported it (inventory.refresh):
// JSON, and when it was stored (microseconds).
type StoredInventory struct {
	NodeID    string
	JSON      string
	UpdatedAt int64
}

// inventoryOf reads a node's stored inventory from row (of the query inventoryQuery), and
// whether it has one.
func inventoryOf(nodeID string, row rowScanner) (StoredInventory, bool, error) {
	inv := StoredInventory{NodeID: nodeID}
	switch err := row.Scan(&inv.JSON, &inv.UpdatedAt); {
	case errors.Is(err, sql.ErrNoRows):
		return inv, false, nil
	case err != nil:
		return inv, false, fmt.Errorf("reading the inventory of node %s: %w", nodeID, err)
	}
	return inv, true, nil
}

const inventoryQuery = `SELECT inventory, updated_at FROM node_inventory WHERE node_id = ?`

// Inventory returns the node's stored inventory (ErrNotFound: it never reported one).
func (s *Store) Inventory(ctx context.Context, nodeID string) (StoredInventory, error) {
	inv, ok, err := inventoryOf(nodeID, s.queryRow(ctx, inventoryQuery, nodeID))
	if err == nil && !ok {
		err = fmt.Errorf("the inventory of node %s: %w", nodeID, ErrNotFound)
	}
	return inv, err
}

// Inventories returns the stored inventories of the nodes ids, by node id (a node that never
// reported one is absent).
func (s *Store) Inventories(ctx context.Context, ids []string) (map[string]StoredInventory, error) {
	out := make(map[string]StoredInventory, len(ids))
	for chunk := range slices.Chunk(ids, 512) {
		in, args := inList(chunk)
		rows, err := s.queryRows(ctx, `SELECT node_id, inventory, updated_at FROM node_inventory WHERE node_id IN `+in, args...)
		invs, err := collect(rows, err, "inventories", func(r interface{ Scan(...any) error }) (StoredInventory, error) {
			var inv StoredInventory
			return inv, r.Scan(&inv.NodeID, &inv.JSON, &inv.UpdatedAt)
		})
		if err != nil {
			return nil, err
		}
		for _, inv := range invs {
			out[inv.NodeID] = inv
		}
	}
	return out, nil
}

// Inventory returns the node's stored inventory in the transaction, and whether it has one.
func (t *Tx) Inventory(ctx context.Context, nodeID string) (StoredInventory, bool, error) {
	return inventoryOf(nodeID, t.queryRow(ctx, inventoryQuery, nodeID))
}

// PutInventory stores the inventory a node's ramdisk reported, in place of the one before.
func (t *Tx) PutInventory(ctx context.Context, nodeID string, inv json.RawMessage) error {
	_, err := t.exec(ctx, `INSERT INTO node_inventory (node_id, inventory, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (node_id) DO UPDATE SET inventory = excluded.inventory, updated_at = excluded.updated_at`, nodeID, string(inv), t.at)
	if err != nil {
		return fmt.Errorf("storing inventory of %s: %w", nodeID, err)
	}
	return nil
}

// AddNodeMAC binds a MAC to a node (out-of-band inspection); a MAC of another node is a conflict.
func (t *Tx) AddNodeMAC(ctx context.Context, n *Node, mac string) error {
	for _, m := range n.MACs {
		if m == mac {
			return nil
		}
	}
	// A MAC of another node is no error of the statement: on PostgreSQL a unique violation
	// would abort the whole transaction, and the caller goes on in it (the step fails with
	// MAC_CONFLICT), as it does on SQLite.
	res, err := t.exec(ctx, `INSERT INTO node_macs (mac, node_id) VALUES (?, ?) ON CONFLICT (mac) DO NOTHING`, mac, n.ID)
	if err != nil {
		return fmt.Errorf("binding MAC %s to node %s: %w", mac, n.ID, err)
	}
	if added, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("binding MAC %s to node %s: %w", mac, n.ID, err)
	} else if added == 0 {
		return fmt.Errorf("MAC %s already belongs to another node: %w", mac, ErrConflict)
	}
	n.MACs = append(n.MACs, mac)
	if _, err := t.exec(ctx, `UPDATE nodes SET macs = ? WHERE id = ?`, mustJSON(n.MACs), n.ID); err != nil {
		return fmt.Errorf("binding MAC %s to node %s: %w", mac, n.ID, err)
	}
	return nil
}

// SetProductUUID records the product UUID found by inspection when none was given.
func (t *Tx) SetProductUUID(ctx context.Context, nodeID, uuid string) error {
	if _, err := t.exec(ctx, `UPDATE nodes SET product_uuid = ? WHERE id = ? AND product_uuid = ''`, strings.ToLower(uuid), nodeID); err != nil {
		return fmt.Errorf("recording the product UUID of node %s: %w", nodeID, err)
	}
	return nil
}

// SetPower records the power axis.
func (t *Tx) SetPower(ctx context.Context, nodeID, power string) error {
	if t.rows().nodeHolds(nodeID, nodePowerText, power) {
		return nil // (the row, as the writer's cache holds it, has that power: nothing to change)
	}
	return t.onNode(nodeID, func(n Node) Node { n.Power = power; return n }, func(row int64) error {
		if row == 0 {
			return t.execLater(ctx, "recording the power of node "+nodeID, `UPDATE nodes SET power = ? WHERE id = ?`, power, nodeID)
		}
		if _, err := t.updateByRow(ctx, `UPDATE nodes SET power = ? WHERE id = ?`, `UPDATE nodes SET power = ? WHERE rowid = ? AND id = ?`, row, []any{power}, nodeID); err != nil {
			return fmt.Errorf("recording the power of node %s: %w", nodeID, err)
		}
		return nil
	})
}

// SetBMCAddress records the BMC address a node's ramdisk reported after provisioning its
// credential in-band; only a node without one takes it (an operator's binding is never moved).
func (t *Tx) SetBMCAddress(ctx context.Context, nodeID, addr string) error {
	res, err := t.exec(ctx, `UPDATE nodes SET bmc_address = ? WHERE id = ? AND bmc_address = ''`, addr, nodeID)
	if err != nil {
		return fmt.Errorf("setting the BMC address of node %s: %w", nodeID, err)
	}
	if c, _ := res.RowsAffected(); c == 0 {
		return fmt.Errorf("setting the BMC address of node %s: it has one already: %w", nodeID, ErrConflict)
	}
	return nil
}

// workflowCommandsQuery lists a workflow's commands of one kind, oldest first, through
// commands_node (a workflow's commands are its node's). SQLite is told the index: left to
// choose, it weighs commands_loose (whose WHERE asks for an empty workflow_id) against the
// value bound to workflow_id, and so prepares the statement again at each run (80 µs of the
// writer's time at each release's read of its wipe).
func workflowCommandsQuery(e Engine) string {
	from := "commands"
	if e == SQLite {
		from += " INDEXED BY commands_node"
	}
	return `SELECT ` + commandCols + ` FROM ` + from + ` WHERE node_id = ? AND workflow_id = ? AND kind = ? ORDER BY created_at`
}

// CommandsOfWorkflow lists the commands of one kind that wf sent, oldest first.
func (t *Tx) CommandsOfWorkflow(ctx context.Context, wf *Workflow, kind string) ([]Command, error) {
	rows, err := t.query(ctx, workflowCommandsQuery(t.s.engine), wf.NodeID, wf.ID, kind)
	return collect(rows, err, "commands of a workflow", scanCommand)
}

// ---------------------------------------------------------------- one-time join tokens

// JoinToken is a one-time token's stored form: only its hash.
type JoinToken struct {
	Hash                 []byte
	Kind, SiteID, NodeID string
	// CommandID is the boot command that carried the token.
	CommandID         string
	Generation        uint64
	ExpiresAt, UsedAt int64
}

// InsertJoinToken stores a token's hash. For node tokens, unused tokens of the same node and
// kind carried by other (older) boot commands are withdrawn: only the newest boot entry's token
// works. Tokens minted for the same command (it was offered again after a reconnect, and the
// agent may have kept the first) stay valid until used or expired.
func (t *Tx) InsertJoinToken(ctx context.Context, jt JoinToken) error {
	if jt.NodeID != "" {
		if _, err := t.exec(ctx, `DELETE FROM join_tokens WHERE node_id = ? AND kind = ? AND used_at = 0 AND command_id <> ?`, jt.NodeID, jt.Kind, jt.CommandID); err != nil {
			return fmt.Errorf("withdrawing older tokens: %w", err)
		}
	}
	_, err := t.exec(ctx, `INSERT INTO join_tokens (hash, kind, site_id, node_id, generation, expires_at, created_at, command_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		t.args(&jt.Hash, &jt.Kind, &jt.SiteID, &jt.NodeID, &jt.Generation, &jt.ExpiresAt, &t.at, &jt.CommandID)...)
	if err != nil {
		return fmt.Errorf("storing join token: %w", err)
	}
	return nil
}

// JoinTokenNode reads the node (and its tenant) and identity generation a join token names, outside any
// transaction: a hint only (UseJoinToken decides), so that what is costly to prepare for the join
// can be prepared before it.
func (s *Store) JoinTokenNode(ctx context.Context, hash []byte) (nodeID, tenantID string, gen uint64, err error) {
	var g int64
	err = s.queryRow(ctx, `SELECT j.node_id, COALESCE(n.tenant_id, ''), j.generation FROM join_tokens j LEFT JOIN nodes n ON n.id = j.node_id
		WHERE j.hash = ?`, hash).Scan(&nodeID, &tenantID, &g)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", 0, ErrTokenInvalid
	}
	return nodeID, tenantID, uint64(g), err
}

// ErrTokenInvalid is a join token that is unknown, used, expired or of another kind.
var ErrTokenInvalid = errors.New("join token is unknown, already used or expired")

// UseJoinToken consumes a one-time token of kind for the key whose hash is keyHash. The same key
// may use the token again within retryWindow: a join whose answer was lost (the server died
// after committing it) can be retried by the agent that made it, and by no one else.
func (t *Tx) UseJoinToken(ctx context.Context, hash []byte, kind string, keyHash []byte, retryWindow time.Duration) (JoinToken, error) {
	var jt JoinToken
	var gen int64
	var usedKey []byte
	err := t.queryRow(ctx, `SELECT hash, kind, site_id, node_id, generation, expires_at, used_at, used_key FROM join_tokens WHERE hash = ?`+t.forUpdate(), hash).
		Scan(&jt.Hash, &jt.Kind, &jt.SiteID, &jt.NodeID, &gen, &jt.ExpiresAt, &jt.UsedAt, &usedKey)
	if errors.Is(err, sql.ErrNoRows) {
		return JoinToken{}, ErrTokenInvalid
	}
	if err != nil {
		return JoinToken{}, fmt.Errorf("reading join token: %w", err)
	}
	retry := jt.UsedAt != 0 && len(keyHash) > 0 && bytes.Equal(usedKey, keyHash) && t.at-jt.UsedAt < retryWindow.Microseconds()
	if jt.Kind != kind || jt.ExpiresAt < t.at || jt.UsedAt != 0 && !retry {
		return JoinToken{}, ErrTokenInvalid
	}
	jt.Generation = uint64(gen)
	if !retry {
		if _, err := t.exec(ctx, `UPDATE join_tokens SET used_at = ?, used_key = ? WHERE hash = ?`, t.at, keyHash, hash); err != nil {
			return JoinToken{}, fmt.Errorf("consuming join token: %w", err)
		}
	}
	return jt, nil
}

// AgentsGoneSince lists agents disconnected since before t whose commands were not yet applied,
// by id (the order in which every server's reaper locks them: StillGoneSince).
func (t *Tx) AgentsGoneSince(ctx context.Context, before int64) ([]string, error) {
	rows, err := t.query(ctx, `SELECT id FROM agents WHERE connected = ? AND last_seen < ? AND last_seen > 0 AND reaped_at = 0 ORDER BY id`, false, before)
	if err != nil {
		return nil, fmt.Errorf("listing departed agents: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// StillGoneSince locks agent id's row (PostgreSQL) and reports whether the agent is still as
// AgentsGoneSince(before) listed it: disconnected at a time before before, its commands not
// yet dealt with. Between that list and the departure's writes the agent may have connected
// again (on any server) and acknowledged a command on its new connection: the departure is
// not applied then, or that command would be lost as the departed connection's
// (ReleaseAgentCommands only keeps the commands it read from a change after its read). Once
// the row is locked, a new connection (UpsertAgent) waits for the departure's transaction.
func (t *Tx) StillGoneSince(ctx context.Context, id string, before int64) (bool, error) {
	var connected bool
	var lastSeen, reaped int64
	err := t.queryRow(ctx, `SELECT connected, last_seen, reaped_at FROM agents WHERE id = ?`+t.forUpdate(), id).Scan(&connected, &lastSeen, &reaped)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading whether agent %s is still departed: %w", id, err)
	}
	return !connected && reaped == 0 && lastSeen > 0 && lastSeen < before, nil
}

// ServerAlive records that server id is alive now (its heartbeat).
func (t *Tx) ServerAlive(ctx context.Context, id string, clockOffset time.Duration) error {
	_, err := t.exec(ctx, `INSERT INTO servers (id, started_at, last_seen, clock_offset) VALUES (?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, clock_offset = excluded.clock_offset`, id, t.at, t.at, clockOffset.Microseconds())
	if err != nil {
		return fmt.Errorf("recording that server %s is alive: %w", id, err)
	}
	return nil
}

// PurgeJoinTokens deletes up to limit join tokens used, or expired unused, before before: one
// is minted for every ramdisk boot and site join, and once spent or expired it only takes room.
// It returns how many it deleted.
func (t *Tx) PurgeJoinTokens(ctx context.Context, before int64, limit int) (int, error) {
	res, err := t.exec(ctx, `DELETE FROM join_tokens WHERE hash IN (SELECT hash FROM join_tokens
		WHERE (used_at > 0 AND used_at < ?) OR (used_at = 0 AND expires_at < ?) LIMIT ?)`, before, before, limit)
	if err != nil {
		return 0, fmt.Errorf("deleting spent join tokens: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// ControlPlaneAlive records, in a server's heartbeat, that the control plane is alive at the
// transaction's time, and returns how long it was not: the time since any server last recorded
// so, when that is longer than gap (no server was alive, or none could write to the store),
// else 0. A clock that went back returns 0.
func (t *Tx) ControlPlaneAlive(ctx context.Context, gap time.Duration) (time.Duration, error) {
	var last int64
	if err := t.queryRow(ctx, `SELECT last_alive FROM control_plane WHERE id = 1`+t.forUpdate()).Scan(&last); err != nil {
		return 0, fmt.Errorf("reading when the control plane was last alive: %w", err)
	}
	if _, err := t.exec(ctx, `UPDATE control_plane SET last_alive = ? WHERE id = 1`, t.at); err != nil {
		return 0, fmt.Errorf("recording that the control plane is alive: %w", err)
	}
	if last == 0 || t.at-last <= gap.Microseconds() {
		return 0, nil
	}
	return time.Duration(t.at-last) * time.Microsecond, nil
}

// ClaimClockStep records that a step forward of the database's clock by step, seen by a
// server whose previous heartbeat was at since (store time, before the step) and whose time is
// still the transaction's (before the step), is being given back to the steps in progress; false
// when another server already did so since (every server sees the same step at its next
// heartbeat, and the steps get its time back once). The step is recorded at the transaction's
// time after the step, which every heartbeat before the step precedes.
func (t *Tx) ClaimClockStep(ctx context.Context, since int64, step time.Duration) (bool, error) {
	res, err := t.exec(ctx, `UPDATE control_plane SET clock_step_at = ? WHERE id = 1 AND clock_step_at <= ?`, t.at+step.Microseconds(), since)
	if err != nil {
		return false, fmt.Errorf("recording a step of the database's clock: %w", err)
	}
	n, _ := res.RowsAffected()
	return n == 1, nil
}

// Watermark is how far a store has come, as a server saw it: the store's id, how many restores
// were fenced in it (Tx.FenceRestore) and how many beats its servers recorded since it was
// created. A store restored from a backup is behind the watermark a server took before the
// restore (Watermark.Behind).
type Watermark struct {
	StoreID string `json:"storeId"`
	Fences  int64  `json:"fences"`
	Beats   int64  `json:"beats"`
}

// Behind says whether a store whose watermark is w went back from seen, a watermark taken from
// it earlier: the same store, with fewer beats since the same fence, or an earlier fence. A
// watermark of another store, or from before a fence that w has, is not ahead of w.
func (w Watermark) Behind(seen Watermark) bool {
	if w.StoreID != seen.StoreID || w.StoreID == "" {
		return false
	}
	return w.Fences < seen.Fences || (w.Fences == seen.Fences && w.Beats < seen.Beats)
}

// Beat counts a beat (a heartbeat, a server's clean stop) and returns the watermark it makes.
func (t *Tx) Beat(ctx context.Context) (Watermark, error) {
	if _, err := t.exec(ctx, `UPDATE control_plane SET beats = beats + 1 WHERE id = 1`); err != nil {
		return Watermark{}, fmt.Errorf("counting a beat of the control plane: %w", err)
	}
	return t.watermark(ctx)
}

// watermarkQuery reads the store's watermark.
const watermarkQuery = `SELECT store_id, fences, beats FROM control_plane WHERE id = 1`

// watermark reads the watermark in the transaction.
func (t *Tx) watermark(ctx context.Context) (Watermark, error) {
	var w Watermark
	if err := t.queryRow(ctx, watermarkQuery).Scan(&w.StoreID, &w.Fences, &w.Beats); err != nil {
		return Watermark{}, fmt.Errorf("reading the store's watermark: %w", err)
	}
	return w, nil
}

// Watermark reads the store's watermark as it stands.
func (s *Store) Watermark(ctx context.Context) (Watermark, error) {
	var w Watermark
	if err := s.queryRow(ctx, watermarkQuery).Scan(&w.StoreID, &w.Fences, &w.Beats); err != nil {
		return Watermark{}, fmt.Errorf("reading the store's watermark: %w", err)
	}
	return w, nil
}

// RestoreWitness is what an agent showed of a store restored with no fence run: a watermark of
// the store newer than the store's own, or a command it took from the store at its current
// fence that the store does not have (Command).
type RestoreWitness struct {
	AgentID string    `json:"agentId"`
	Seen    Watermark `json:"seen"`
	Command string    `json:"command,omitempty"`
	At      int64     `json:"at"` // store time, microseconds
}

// WitnessRestore records w unless an agent already showed the store's restore: whether w is the
// first since the last fence.
func (t *Tx) WitnessRestore(ctx context.Context, w RestoreWitness) (bool, error) {
	b, err := json.Marshal(w)
	if err != nil {
		return false, fmt.Errorf("recording a restore's witness: %w", err)
	}
	res, err := t.exec(ctx, `UPDATE control_plane SET restore_witness = ? WHERE id = 1 AND restore_witness = ''`, string(b))
	if err != nil {
		return false, fmt.Errorf("recording a restore's witness: %w", err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// RestoreWitnessed returns what an agent showed of the store's restore since the last fence, if
// one did.
func (s *Store) RestoreWitnessed(ctx context.Context) (RestoreWitness, bool, error) {
	var raw string
	if err := s.queryRow(ctx, `SELECT restore_witness FROM control_plane WHERE id = 1`).Scan(&raw); err != nil {
		return RestoreWitness{}, false, fmt.Errorf("reading whether an agent witnessed a restore: %w", err)
	}
	if raw == "" {
		return RestoreWitness{}, false, nil
	}
	var w RestoreWitness
	if err := json.Unmarshal([]byte(raw), &w); err != nil {
		return RestoreWitness{}, false, fmt.Errorf("reading a restore's witness %q: %w", raw, err)
	}
	return w, true, nil
}

// ServersAliveSince lists the servers that recorded they were alive at since or later, by id.
func (t *Tx) ServersAliveSince(ctx context.Context, since int64) ([]string, error) {
	rows, err := t.query(ctx, `SELECT id FROM servers WHERE last_seen >= ? ORDER BY id`, since)
	if err != nil {
		return nil, fmt.Errorf("listing the servers alive: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("listing the servers alive: %w", err)
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// Fenced is what a restore's fence did (Tx.FenceRestore).
type Fenced struct {
	// Commands queued that no agent had acknowledged in the restored store, now lost.
	Commands int
	// Tokens are the one-time join tokens still unused in the restored store, now void.
	Tokens int
	// Nodes whose reconciler was woken for their lost commands.
	Nodes []string
	// Watermark is the store's after the fence.
	Watermark Watermark
}

// RestoreFenceError is the error of the commands a restore's fence records lost.
const RestoreFenceError = "the store was restored from a backup: an agent may have taken this command after the backup, so it is never sent"

// FenceRestore makes a store restored from a backup safe to run: what agents did after the
// backup is not in it, and they did not forget it.
//
//   - Every command still queued (unacknowledged in the restored store), or held for its
//     approval, is lost: an agent may have acknowledged and run it after the backup (after an
//     approval the restored store does not know), and it is never sent to another. Its step
//     decides, as for any lost command (a query, a retry, or a failure). Acknowledged commands
//     stay as they are: their agent reports them, or its departure loses them.
//   - Every one-time join token still unused is void: it may have been used after the backup
//     (a ramdisk's join, a site agent's bootstrap). Their steps mint new ones.
//   - The fence count goes up, so that servers' watermarks from before it no longer count.
//
// The nodes of the lost commands are woken.
func (t *Tx) FenceRestore(ctx context.Context) (Fenced, error) {
	var f Fenced
	rows, err := t.query(ctx, `UPDATE commands SET state = 'lost', finished_at = ?, error = ?
		WHERE state IN ('held', 'queued') RETURNING node_id`, t.at, RestoreFenceError)
	if err != nil {
		return Fenced{}, fmt.Errorf("recording the queued commands lost: %w", err)
	}
	nodes := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return Fenced{}, fmt.Errorf("reading the lost commands' nodes: %w", err)
		}
		f.Commands++
		if n != "" && !nodes[n] {
			nodes[n] = true
			f.Nodes = append(f.Nodes, n)
		}
	}
	if err := rows.Close(); err != nil {
		return Fenced{}, fmt.Errorf("recording the queued commands lost: %w", err)
	}
	if err := rows.Err(); err != nil {
		return Fenced{}, fmt.Errorf("recording the queued commands lost: %w", err)
	}
	slices.Sort(f.Nodes)
	for _, n := range f.Nodes {
		if err := t.Wake(ctx, n, "restore fenced", 0); err != nil {
			return Fenced{}, err
		}
	}
	res, err := t.exec(ctx, `UPDATE join_tokens SET expires_at = ? WHERE used_at = 0 AND expires_at > ?`, t.at, t.at)
	if err != nil {
		return Fenced{}, fmt.Errorf("voiding the unused join tokens: %w", err)
	}
	n, _ := res.RowsAffected()
	f.Tokens = int(n)
	// A fence is numbered by its time (or one above the last, if that is later): a backup taken
	// before an earlier fence and restored now gets a fence above that earlier one, so the
	// watermarks servers and agents kept after it do not hold this store behind.
	if _, err := t.exec(ctx, `UPDATE control_plane SET fences = CASE WHEN fences + 1 > ? THEN fences + 1 ELSE ? END, restore_witness = '' WHERE id = 1`,
		t.at, t.at); err != nil {
		return Fenced{}, fmt.Errorf("counting the fence: %w", err)
	}
	if f.Watermark, err = t.watermark(ctx); err != nil {
		return Fenced{}, err
	}
	return f, nil
}

// ExtendStepDeadlines gives the steps in progress of every open workflow d more time: the
// length of an outage of the control plane that ends now, or of a step forward of the clock.
// The step's start and deadline move by d, and so do the deadlines of commands not yet finished. The deadline of a step whose command
// an agent took is the command's (the whole time from when it was taken), moved by d. Boot
// entries' join tokens still unused and valid when the outage began move by d too (a ramdisk
// that booted meanwhile joins with one). It returns how many workflows it changed.
func (t *Tx) ExtendStepDeadlines(ctx context.Context, d time.Duration) (int, error) {
	us := d.Microseconds()
	if _, err := t.exec(ctx, `UPDATE join_tokens SET expires_at = expires_at + ? WHERE node_id <> '' AND used_at = 0 AND expires_at > ?`,
		us, t.at-us); err != nil {
		return 0, fmt.Errorf("extending the boot entries' join tokens: %w", err)
	}
	if _, err := t.exec(ctx, `UPDATE commands SET deadline = deadline + ?
		WHERE deadline > 0 AND state IN ('queued', 'delivered', 'running')
		AND id IN (SELECT current_command FROM workflows WHERE NOT outcome_applied AND current_command <> '')`, us); err != nil {
		return 0, fmt.Errorf("extending the deadlines of commands in progress: %w", err)
	}
	res, err := t.exec(ctx, `UPDATE workflows SET step_started_at = step_started_at + ?,
		step_deadline = COALESCE((SELECT CASE WHEN c.deadline > workflows.step_deadline + ? THEN c.deadline ELSE workflows.step_deadline + ? END
			FROM commands c WHERE c.id = workflows.current_command AND c.state IN ('delivered', 'running')), step_deadline + ?)
		WHERE NOT outcome_applied AND step_started_at > 0`, us, us, us, us)
	if err != nil {
		return 0, fmt.Errorf("extending the deadlines of steps in progress: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// EndDeadServersConnections ends the agent connections held by servers other than self that
// have not been alive since before: each counts as departed when its server was last alive, so
// that the agents' grace period runs from then. A dead server's row is removed once it holds no
// connection. It returns how many connections it ended.
func (t *Tx) EndDeadServersConnections(ctx context.Context, self string, before int64) (int, error) {
	res, err := t.exec(ctx, `UPDATE agents SET connected = ?, last_seen = (SELECT s.last_seen FROM servers s WHERE s.id = agents.server_id)
		WHERE connected = ? AND server_id <> '' AND server_id <> ? AND server_id IN (SELECT id FROM servers WHERE last_seen < ?)`,
		false, true, self, before)
	if err != nil {
		return 0, fmt.Errorf("ending the connections of dead servers: %w", err)
	}
	n, _ := res.RowsAffected()
	if _, err := t.exec(ctx, `DELETE FROM servers WHERE last_seen < ? AND id <> ? AND id NOT IN (SELECT server_id FROM agents WHERE connected = ?)`,
		before, self, true); err != nil {
		return 0, fmt.Errorf("forgetting dead servers: %w", err)
	}
	return int(n), nil
}

// ServerLeaving records that server id stops cleanly: the agent connections it still holds end
// now (their agents' grace runs from now), the wake-ups it leased are due again at once for the
// other servers, instead of when their leases expire, and its row goes.
func (t *Tx) ServerLeaving(ctx context.Context, id string) error {
	if _, err := t.exec(ctx, `UPDATE agents SET connected = ?, last_seen = ? WHERE server_id = ? AND connected = ?`, false, t.at, id, true); err != nil {
		return fmt.Errorf("ending the agent connections of server %s: %w", id, err)
	}
	if _, err := t.exec(ctx, `UPDATE reconcile_queue SET leased_by = '', leased_until = 0 WHERE leased_by = ?`, id); err != nil {
		return fmt.Errorf("handing back the wake-ups leased by server %s: %w", id, err)
	}
	if _, err := t.exec(ctx, `DELETE FROM servers WHERE id = ?`, id); err != nil {
		return fmt.Errorf("removing server %s: %w", id, err)
	}
	return nil
}

// ReassertConnection records again as connected an agent connection of server that another
// server ended (EndDeadServersConnections) while server could not show it was alive (it was cut
// off from the store): the connection counted as departed at server's last heartbeat,
// lastAlive, or before. A connection that departed after it (the agent left) stays ended. The
// decisions taken meanwhile on the agent's commands stand; its next departure is dealt with as
// any (its mark as reaped goes).
func (t *Tx) ReassertConnection(ctx context.Context, id, connID, server string, lastAlive int64) error {
	_, err := t.exec(ctx, `UPDATE agents SET connected = ?, last_seen = ?, reaped_at = 0 WHERE id = ? AND conn_id = ? AND server_id = ? AND connected = ? AND last_seen <= ?`,
		true, t.at, id, connID, server, false, lastAlive)
	if err != nil {
		return fmt.Errorf("recording again the connection of agent %s: %w", id, err)
	}
	return nil
}

// MarkAgentReaped records that a departed agent's commands were dealt with (its last_seen, when
// it went away, stays for an operator to read).
func (t *Tx) MarkAgentReaped(ctx context.Context, id string) error {
	if _, err := t.exec(ctx, `UPDATE agents SET reaped_at = ? WHERE id = ? AND connected = ?`, t.at, id, false); err != nil {
		return fmt.Errorf("recording that the commands of agent %s were dealt with: %w", id, err)
	}
	return nil
}

// StrandedNodes lists nodes a workflow chain controls that have neither an open workflow nor a
// wake-up row: nothing would ever move them (the engine's sweep wakes them; doctor shows them).
func (s *Store) StrandedNodes(ctx context.Context, limit int) ([]Node, error) {
	rows, err := s.queryRows(ctx, `SELECT `+nodeCols+` FROM nodes WHERE `+strandedWhere+` ORDER BY id LIMIT ?`, false, false, limit)
	return collect(rows, err, "stranded nodes", scanNode)
}

// FailedInMaintenance lists the nodes waiting in maintenance for an operator: failed ones, and
// resting ones that carry a fault (RECONCILE_FAILED on a deployed node keeps its state).
func (s *Store) FailedInMaintenance(ctx context.Context, tenantID string, limit int) ([]Node, error) {
	rows, err := s.queryRows(ctx, `SELECT `+nodeCols+` FROM nodes WHERE (state = 'failed' OR fault_code <> '') AND maintenance = ? AND (? = '' OR tenant_id = ?) ORDER BY updated_at LIMIT ?`,
		true, tenantID, tenantID, limit)
	return collect(rows, err, "failed nodes", scanNode)
}

// Server is a server that shares the store, as its heartbeats recorded it.
type Server struct {
	ID                  string
	StartedAt, LastSeen int64
	// Agents counts the agent connections it holds.
	Agents int
	// ClockOffset is how far its local clock was from the database's at its last heartbeat
	// (the database's less its own; the server keeps the database's time).
	ClockOffset time.Duration
}

// Servers lists the servers sharing the store (a dead one until its connections are ended),
// most recently alive first.
func (s *Store) Servers(ctx context.Context) ([]Server, error) {
	rows, err := s.queryRows(ctx, `SELECT s.id, s.started_at, s.last_seen, s.clock_offset,
		(SELECT COUNT(*) FROM agents a WHERE a.server_id = s.id AND a.connected = ?) FROM servers s ORDER BY s.last_seen DESC, s.id`, true)
	return collect(rows, err, "servers", func(r interface{ Scan(...any) error }) (Server, error) {
		var sv Server
		var off int64
		err := r.Scan(&sv.ID, &sv.StartedAt, &sv.LastSeen, &off, &sv.Agents)
		sv.ClockOffset = time.Duration(off) * time.Microsecond
		return sv, err
	})
}

// SiteAgents lists site agents.
func (s *Store) SiteAgents(ctx context.Context) ([]Agent, error) {
	rows, err := s.queryRows(ctx, `SELECT id, kind, site_id, node_id, generation, connected, connected_at, last_seen, version, conn_id, server_id,
		cert_renew_at, cert_not_after, dhcp_mode, boot_binding, artifact_cache FROM agents WHERE kind = 'site' ORDER BY site_id, id`)
	if err != nil {
		return nil, fmt.Errorf("listing site agents: %w", err)
	}
	defer rows.Close()
	var out []Agent
	for rows.Next() {
		var a Agent
		var gen int64
		var cache string
		if err := rows.Scan(&a.ID, &a.Kind, &a.SiteID, &a.NodeID, &gen, &a.Connected, &a.ConnectedAt, &a.LastSeen, &a.Version, &a.ConnID, &a.ServerID,
			&a.CertRenewAt, &a.CertNotAfter, &a.DHCPMode, &a.BootBinding, &cache); err != nil {
			return nil, err
		}
		if cache != "" {
			if err := json.Unmarshal([]byte(cache), &a.Cache); err != nil {
				return nil, fmt.Errorf("listing site agents: the artifact cache of %s: %w", a.ID, err)
			}
		}
		a.Generation = uint64(gen)
		out = append(out, a)
	}
	return out, rows.Err()
}

// PutProfile stores an operator-defined deploy profile (JSON).
func (t *Tx) PutProfile(ctx context.Context, name, definition string) error {
	_, err := t.exec(ctx, `INSERT INTO deploy_profiles (name, definition, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, updated_at = excluded.updated_at`, name, definition, t.at)
	if err != nil {
		return fmt.Errorf("storing profile %s: %w", name, err)
	}
	return nil
}

// DeleteProfile deletes the profile stored through the API under name, refused (ErrConflict,
// naming up to five of them) while a node deploying, or failed while deploying, names it: its
// deploy, or the recovery that deploys again, reads the profile when its workflow starts.
// ErrNotFound when none is stored under name.
func (t *Tx) DeleteProfile(ctx context.Context, name string) error {
	rows, err := t.query(ctx, `SELECT name FROM nodes WHERE deploy_profile = ?
		AND (state = 'deploying' OR (state = 'failed' AND failed_from = 'deploying')) ORDER BY name LIMIT 6`, name)
	users, err := collect(rows, err, "the nodes deploying with profile "+name, scanID)
	if err != nil {
		return err
	}
	if len(users) > 0 {
		more := ""
		if len(users) > 5 {
			users, more = users[:5], " and more"
		}
		return fmt.Errorf("profile %s is the deploy profile of nodes deploying or failed while deploying (%s%s): recover, abort or deploy them with another profile first: %w",
			name, strings.Join(users, ", "), more, ErrConflict)
	}
	res, err := t.exec(ctx, `DELETE FROM deploy_profiles WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("deleting profile %s: %w", name, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("deleting profile %s: %w", name, err)
	} else if n == 0 {
		return fmt.Errorf("profile %s: %w", name, ErrNotFound)
	}
	return nil
}

// Profiles returns the operator-defined deploy profiles by name (JSON definitions).
func (s *Store) Profiles(ctx context.Context) (map[string]string, error) {
	rows, err := s.queryRows(ctx, `SELECT name, definition FROM deploy_profiles ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("listing profiles: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var n, d string
		if err := rows.Scan(&n, &d); err != nil {
			return nil, err
		}
		out[n] = d
	}
	return out, rows.Err()
}

// Profile reads one operator-defined profile inside a transaction.
func (t *Tx) Profile(ctx context.Context, name string) (string, bool, error) {
	// SQLite's writer keeps what it read (a definition, or none) until a statement changes the
	// table.
	rc := t.rows()
	if v, ok := rc.memo(memoDeployProfiles, name); ok {
		d := v.(storedProfile)
		return d.definition, d.ok, nil
	}
	var d string
	err := t.queryRow(ctx, `SELECT definition FROM deploy_profiles WHERE name = ?`, name).Scan(&d)
	if errors.Is(err, sql.ErrNoRows) {
		rc.remember(memoDeployProfiles, name, storedProfile{})
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("reading profile %s: %w", name, err)
	}
	rc.remember(memoDeployProfiles, name, storedProfile{d, true})
	return d, true, nil
}

// storedProfile is what Tx.Profile read: the definition, or ok false for none.
type storedProfile struct {
	definition string
	ok         bool
}
