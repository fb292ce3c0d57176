package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"bcd/internal/lograte"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// A node whose reconciliation fails is retried with a back-off and, when it keeps failing, gets
// a fault (DESIGN §5: nothing stays stuck without one). The run of failures is counted on the
// node's wake-up row (store.ReconcileFailures), so it survives restarts and is shared by the
// servers sharing the store.
const (
	// reconcileRetryMin is the delay after a first failure; it doubles with each failure in a
	// row up to reconcileRetryMax (reconcileRetry).
	reconcileRetryMin = 5 * time.Second
	reconcileRetryMax = 5 * time.Minute
	// reconcileFaultAfter failures in a row, the first at least reconcileFaultSpan before the
	// last, raise RECONCILE_FAILED. By the back-off alone the 8th failure comes 10 min 15 s after
	// the first: long enough to ride out what passes (a database fail-over, a server upgrade, a
	// lock held too long), short beside the minutes to hours a workflow's steps may take. The
	// span keeps a burst of failures (wake-ups make a node due before its back-off) from raising
	// it within seconds.
	reconcileFaultAfter = 8
	reconcileFaultSpan  = 2 * time.Minute
	// reconcileParked is how often a node whose fault is raised is still retried (a wake-up, an
	// operator's verb among them, makes it due at once): a success ends the run and its row.
	reconcileParked = time.Hour
	// maxReconcileError bounds the error text kept on the wake-up row and the node's fault.
	maxReconcileError = 512
	// failLogEvery is how often a node's repeated failures are logged (its first failure and
	// its fault always are); failLogKeys bounds the nodes remembered for it.
	failLogEvery = 10 * time.Minute
	failLogKeys  = 4096
)

// failingNodes is the engine's side of failed reconciliations: its counters, its log limiter and
// the tests' failure injection.
type failingNodes struct {
	failures, faults atomic.Int64
	once             sync.Once
	quiet            *lograte.Limiter
	// inject, when set, fails the reconciliation of the nodes it returns an error for, after
	// the run decided (its writes are then undone). Only tests in this package set it; no
	// configuration reaches it.
	inject func(nodeID string) error
}

func (f *failingNodes) limiter() *lograte.Limiter {
	f.once.Do(func() { f.quiet = lograte.New(failLogEvery, failLogKeys) })
	return f.quiet
}

// ReconcileFailures counts the node reconciliations this engine saw fail since it started (a
// node that keeps failing counts each time it is retried).
func (e *Engine) ReconcileFailures() int64 { return e.failing.failures.Load() }

// ReconcileFaults counts the RECONCILE_FAILED faults this engine raised since it started.
func (e *Engine) ReconcileFaults() int64 { return e.failing.faults.Load() }

// reconcileRetry is the delay before the next attempt after failures failed reconciliations in a
// row: 5 s, doubled with each failure, at most 5 min. Pure.
func reconcileRetry(failures int) time.Duration {
	d := reconcileRetryMin
	for i := 1; i < failures && d < reconcileRetryMax; i++ {
		d *= 2
	}
	return min(d, reconcileRetryMax)
}

// failureOutcome is what one more failed reconciliation does to a node (decideReconcileFailure).
type failureOutcome struct {
	next  store.ReconcileFailures // the run to record
	again time.Duration           // until the node is due again
	first bool                    // the run begins with this failure
	raise bool                    // raise RECONCILE_FAILED now
}

// decideReconcileFailure counts a failed reconciliation at at (store microseconds) with error
// errText into the node's run prev. faulted says whether the node carries the fault the run
// raised, maintenance on: a run whose fault an operator has cleared (recover, maintenance off)
// is over, and this failure begins a new one. Pure.
func decideReconcileFailure(prev store.ReconcileFailures, faulted bool, at int64, errText string) failureOutcome {
	if prev.FaultRaisedAt != 0 && !faulted {
		prev = store.ReconcileFailures{}
	}
	o := failureOutcome{next: prev}
	o.next.Count++
	o.next.LastError = errText
	if prev.Count == 0 || prev.Since == 0 {
		o.next.Since, o.first = at, true
	}
	switch {
	case o.next.FaultRaisedAt != 0:
		o.again = reconcileParked
	case o.next.Count >= reconcileFaultAfter && at-o.next.Since >= reconcileFaultSpan.Microseconds():
		o.raise = true
		o.again = reconcileRetry(o.next.Count)
	default:
		o.again = reconcileRetry(o.next.Count)
	}
	return o
}

// reconcileFaultOn is the fault a run of failures raises on node v: a workflow-driven node fails
// (failed_from its state, its target kept, so recover resumes its chain), a resting one keeps its
// state (failing a deployed node would take it from its tenant for a fault of the control
// plane); either way with RECONCILE_FAILED, maintenance on. busy says which. Pure.
func reconcileFaultOn(v store.NodeFaultView, f store.ReconcileFailures) (fault store.NodeFault, busy bool) {
	pn := provision.Node{State: provision.State(v.State), Target: provision.State(v.TargetState), FailedFrom: provision.State(v.FailedFrom), Maintenance: v.Maintenance}
	code := string(provision.FaultReconcileFailed)
	fault = store.NodeFault{State: v.State, FailedFrom: v.FailedFrom, FaultCode: code,
		FaultMsg: truncate(fmt.Sprintf("%d reconciliations in a row failed since %s; the last: %s", f.Count,
			store.Micros(f.Since).Format(time.RFC3339), f.LastError), 1000),
		MaintenanceReason: fmt.Sprintf("%s: %d reconciliations in a row failed", code, f.Count)}
	if pn.Busy() {
		m := provision.Fail(pn, provision.FaultReconcileFailed)
		fault.State, fault.FailedFrom = string(m.To), string(m.FailedFrom)
		return fault, true
	}
	return fault, false
}

// reconcileError is err's text as kept: valid UTF-8 (PostgreSQL refuses anything else in text),
// at most maxReconcileError bytes, cut at a character's boundary. Pure.
func reconcileError(err error) string {
	s := strings.ToValidUTF8(err.Error(), "?")
	if len(s) <= maxReconcileError {
		return s
	}
	cut := maxReconcileError
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// reconcileFailed deals with a failed reconciliation of lease l (its writes already undone):
// it counts it on the node's wake-up row, which it makes due again after the back-off, raises
// RECONCILE_FAILED once the run is long enough, and logs (the first failure and the fault
// always, the others at most every failLogEvery per node). It returns rerr with what went wrong
// meanwhile. A failure while the engine stops is left uncounted (the lease is handed over).
func (e *Engine) reconcileFailed(ctx context.Context, l store.Lease, rerr error) error {
	if ctx.Err() != nil {
		return rerr
	}
	e.failing.failures.Add(1)
	log := e.log
	errText := reconcileError(rerr)
	var o failureOutcome
	var at int64
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		o, at = failureOutcome{}, tx.At()
		faulted := false
		v, err := tx.LockNodeFaultView(ctx, l.NodeID)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return err
		default:
			faulted = v.Maintenance && v.FaultCode == string(provision.FaultReconcileFailed)
		}
		prev, held, err := tx.LeasedReconcileFailures(ctx, l, e.owner)
		if err != nil || !held {
			return err
		}
		o = decideReconcileFailure(prev, faulted, at, errText)
		return tx.RecordReconcileFailure(ctx, l, e.owner, o.next, o.again)
	})
	quiet := e.failing.limiter()
	now := store.Micros(at)
	if err != nil {
		quiet.Log(ctx, log, slog.LevelError, time.Now(), "record", "recording a failed reconciliation; the node is retried when its lease expires",
			"node", l.NodeID, "reconcile_error", errText, "error", err)
		return errors.Join(rerr, err)
	}
	if o.next.Count == 0 {
		return rerr // the lease had expired: the row is another's
	}
	attrs := []any{"node", l.NodeID, "failures", o.next.Count, "since", store.Micros(o.next.Since), "error", errText}
	switch {
	case o.first:
		quiet.Allow(l.NodeID, now) // the repeats that follow within failLogEvery are held back
		log.Warn("reconciling node failed; retried with back-off, RECONCILE_FAILED raised if it goes on",
			append(attrs, "retry_in", o.again)...)
	case !o.raise:
		quiet.Log(ctx, log, slog.LevelWarn, now, l.NodeID, "reconciling node still fails", append(attrs, "retry_in", o.again)...)
	}
	if !o.raise {
		return rerr
	}
	if err := e.raiseReconcileFault(ctx, l.NodeID, o.next); err != nil {
		log.Error("raising RECONCILE_FAILED; tried again at the next failure", append(attrs, "raise_error", err)...)
		return errors.Join(rerr, err)
	}
	e.failing.faults.Add(1)
	log.Error("reconciling node keeps failing: RECONCILE_FAILED raised, maintenance on; fix the cause, then recover the node (failed) or turn maintenance off (resting)", attrs...)
	return rerr
}

// raiseReconcileFault raises RECONCILE_FAILED on node id for the run f, in a transaction of its
// own: the fault on the node (reconcileFaultOn) with maintenance on, the workflow of a busy node
// asked to abort (its cleanup runs once a reconciliation succeeds), a node.fail event (node.fault
// for a resting node) carrying the error, the run marked as having raised it (later failures
// only park the node: reconcileParked), and the node due at once, for a last look with the fault
// in place.
func (e *Engine) raiseReconcileFault(ctx context.Context, id string, f store.ReconcileFailures) error {
	return e.st.Write(ctx, func(tx *store.Tx) error {
		v, err := tx.LockNodeFaultView(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		fault, busy := reconcileFaultOn(v, f)
		if err := tx.SetNodeFault(ctx, id, fault); err != nil {
			return err
		}
		kind := "node.fault"
		if busy {
			kind = "node.fail"
			if err := tx.RequestWorkflowAbort(ctx, id); err != nil {
				return err
			}
		}
		data, _ := json.Marshal(map[string]any{"fault": fault.FaultCode, "failures": f.Count, "since": store.Micros(f.Since), "error": f.LastError})
		if err := tx.AppendEvent(ctx, store.Event{TenantID: v.TenantID, NodeID: id, Actor: "reconciler", Kind: kind,
			FromState: v.State, ToState: fault.State, Reason: fault.FaultMsg, Data: string(data)}); err != nil {
			return err
		}
		if err := tx.MarkReconcileFaultRaised(ctx, id); err != nil {
			return err
		}
		return tx.Wake(ctx, id, "reconcile fault raised", 0)
	})
}

// clearReconcileFault clears RECONCILE_FAILED from a resting node an operator took out of
// maintenance, once a reconciliation of it succeeds (a failed node's fault goes with recover).
// It writes only then: a node without the fault costs nothing.
func (r *run) clearReconcileFault() error {
	n := &r.n
	if n.ID == "" || n.FaultCode != string(provision.FaultReconcileFailed) || n.Maintenance || n.State == string(provision.Failed) {
		return nil
	}
	n.FaultCode, n.FaultMsg = "", ""
	if err := r.tx.UpdateNode(r.ctx, n); err != nil {
		return err
	}
	return r.tx.AppendEvent(r.ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: "reconciler", Kind: "node.fault_cleared",
		FromState: n.State, ToState: n.State, Reason: string(provision.FaultReconcileFailed) + " cleared: the node reconciles again",
		Data: `{"fault":"` + string(provision.FaultReconcileFailed) + `"}`})
}
