// Package provision is the provision state machine of DESIGN §4, as data: the states, the verbs,
// which verb moves a node from which state to which, the chain of workflow-driven states, the
// recover targets and the fault codes. Every decision is a pure function over these tables; the
// store applies them and records the move.
package provision

import (
	"fmt"
	"slices"
	"strings"
)

// State is a node's provision state.
type State string

const (
	Enrolling     State = "enrolling"
	Inspecting    State = "inspecting"
	Commissioning State = "commissioning"
	Manageable    State = "manageable"
	Ready         State = "ready"
	Deploying     State = "deploying"
	Deployed      State = "deployed"
	Releasing     State = "releasing"
	Rescue        State = "rescue"
	Retiring      State = "retiring"
	Retired       State = "retired"
	Failed        State = "failed"
)

// Kind says whether a state rests or is driven by a workflow. Rescue is both: it is driven while
// metal-rescue or metal-unrescue runs (the node has a target) and rests once its workflow is done.
type Kind int

const (
	Resting Kind = iota
	WorkflowDriven
	RestingOrDriven
)

// StateInfo is one row of the state table.
type StateInfo struct {
	State State
	Kind  Kind
	// Profile is the built-in workflow profile the reconciler runs in this state, keyed by the
	// node's target where one state runs different workflows (rescue). Empty for deploying: the
	// tenant's deploy profile is used.
	Profile func(target State) string
}

func fixed(p string) func(State) string { return func(State) string { return p } }

// States is the state table, in lifecycle order.
var states = []StateInfo{
	{Enrolling, WorkflowDriven, fixed("metal-enroll")},
	{Inspecting, WorkflowDriven, fixed("metal-inspect")},
	{Commissioning, WorkflowDriven, fixed("metal-commission")},
	{Manageable, Resting, fixed("")},
	{Ready, Resting, fixed("")},
	{Deploying, WorkflowDriven, fixed("")},
	{Deployed, Resting, fixed("")},
	{Releasing, WorkflowDriven, fixed("metal-release")},
	{Rescue, RestingOrDriven, func(t State) string {
		if t == Deployed {
			return "metal-unrescue"
		}
		return "metal-rescue"
	}},
	{Retiring, WorkflowDriven, fixed("metal-retire")},
	{Retired, Resting, fixed("")},
	{Failed, Resting, fixed("")},
}

// States returns every state, in lifecycle order.
func States() []State {
	out := make([]State, len(states))
	for i, s := range states {
		out[i] = s.State
	}
	return out
}

// Info returns the row of s.
func Info(s State) (StateInfo, bool) {
	for _, r := range states {
		if r.State == s {
			return r, true
		}
	}
	return StateInfo{}, false
}

// ParseState validates s.
func ParseState(s string) (State, error) {
	if _, ok := Info(State(s)); ok {
		return State(s), nil
	}
	return "", fmt.Errorf("unknown state %q: accepted are %s", s, joinStates(States()))
}

// Verb is something an operator (or the enroll API) asks of a node.
type Verb string

const (
	VerbEnroll      Verb = "enroll"
	VerbManage      Verb = "manage"
	VerbInspect     Verb = "inspect"
	VerbProvide     Verb = "provide"
	VerbDeploy      Verb = "deploy"
	VerbUndeploy    Verb = "undeploy"
	VerbRescue      Verb = "rescue"
	VerbUnrescue    Verb = "unrescue"
	VerbRetire      Verb = "retire"
	VerbRecover     Verb = "recover"
	VerbAbort       Verb = "abort"
	VerbPower       Verb = "power"
	VerbMaintenance Verb = "maintenance"
	VerbDelete      Verb = "delete"
)

// Busy says when a verb applies relative to a node's workflow.
type Busy int

const (
	WhenResting Busy = iota // only when no workflow controls the node
	WhenBusy                // only while a workflow controls the node
	Either                  // regardless
)

// Rule is one row of the verb table.
type Rule struct {
	Verb Verb
	From []State // states the verb is accepted in; empty for enroll (creates the node)
	When Busy
	// To is the state the verb moves the node to; empty means "does not change the state".
	// Recover computes it from failed_from (see RecoverTarget).
	To State
	// Target is the resting state the chain ends in; TargetFrom means "the state the verb came
	// from" (inspect returns to where it started), TargetKeep keeps the node's target.
	Target State
	// InMaintenance: the verb is accepted while the maintenance flag is on.
	InMaintenance bool
	// Queues the reconciler (the verb starts or stops a workflow).
	Wakes bool
}

// Special Target values.
const (
	TargetFrom State = "<from>"
	TargetKeep State = "<keep>"
)

var resting = []State{Manageable, Ready, Deployed, Rescue, Failed, Retired}

var rules = []Rule{
	{Verb: VerbEnroll, To: Enrolling, Target: Ready, Wakes: true},
	{Verb: VerbManage, From: []State{Ready}, To: Manageable},
	{Verb: VerbInspect, From: []State{Manageable, Ready}, To: Inspecting, Target: TargetFrom, Wakes: true},
	{Verb: VerbProvide, From: []State{Manageable}, To: Commissioning, Target: Ready, Wakes: true},
	{Verb: VerbDeploy, From: []State{Ready}, To: Deploying, Target: Deployed, Wakes: true},
	{Verb: VerbUndeploy, From: []State{Deployed, Rescue}, To: Releasing, Target: Ready, Wakes: true},
	{Verb: VerbRescue, From: []State{Deployed}, To: Rescue, Target: Rescue, Wakes: true},
	{Verb: VerbUnrescue, From: []State{Rescue}, To: Rescue, Target: Deployed, Wakes: true},
	{Verb: VerbRetire, From: []State{Manageable, Ready, Deployed, Failed}, To: Retiring, Target: Retired, Wakes: true},
	{Verb: VerbRecover, From: []State{Failed}, Target: TargetKeep, InMaintenance: true, Wakes: true},
	{Verb: VerbAbort, From: []State{Enrolling, Inspecting, Commissioning, Deploying, Releasing, Rescue, Retiring}, When: WhenBusy, To: Failed, Target: TargetKeep, InMaintenance: true, Wakes: true},
	{Verb: VerbPower, From: resting, InMaintenance: true},
	{Verb: VerbMaintenance, From: States(), When: Either, InMaintenance: true},
	{Verb: VerbDelete, From: []State{Manageable, Ready, Retired, Failed}, InMaintenance: true},
}

// Verbs lists every verb in table order.
func Verbs() []Verb {
	out := make([]Verb, len(rules))
	for i, r := range rules {
		out[i] = r.Verb
	}
	return out
}

// RuleOf returns the table row of v.
func RuleOf(v Verb) (Rule, bool) {
	for _, r := range rules {
		if r.Verb == v {
			return r, true
		}
	}
	return Rule{}, false
}

// recoverTargets is metalRecoverTargets: where a failed node goes on recover, by failed_from.
// A failed deploy is released (wiped) before it can be ready again.
var recoverTargets = map[State]State{
	Enrolling:     Enrolling,
	Inspecting:    Inspecting,
	Commissioning: Commissioning,
	Deploying:     Releasing,
	Releasing:     Releasing,
	Rescue:        Rescue,
	Retiring:      Retiring,
}

// RecoverTarget returns the state recover moves a node that failed in from to.
func RecoverTarget(from State) (State, bool) {
	s, ok := recoverTargets[from]
	return s, ok
}

// deleteUnsafeFailedFrom: a node that failed while it held a tenant's data or was being erased
// must be recovered or retired first, never deleted.
var deleteUnsafeFailedFrom = []State{Deploying, Releasing, Rescue, Retiring}

// Node is what the decision functions need to know about a node.
type Node struct {
	State       State
	Target      State // non-empty while a workflow chain controls the node
	FailedFrom  State
	Maintenance bool
}

// Busy reports whether a workflow chain controls the node. A failed node keeps its target (so
// recover knows where the chain was heading) but rests.
func (n Node) Busy() bool { return n.Target != "" && n.State != Failed }

// Move is the outcome of an accepted verb.
type Move struct {
	From, To       State
	Target         State // the node's target after the move ("" when resting)
	FailedFrom     State // set by abort
	MaintenanceOn  bool  // abort and failures turn maintenance on
	Fault          Fault // set when the move fails the node
	ClearFault     bool  // recover clears the fault and maintenance
	Wakes          bool  // queue the node's reconciler in the same transaction
	StateUnchanged bool
}

// RefusedError is a verb the table does not accept in the node's current state.
type RefusedError struct {
	Verb     Verb
	Node     Node
	Why      string
	Accepted []Verb
}

func (e *RefusedError) Error() string {
	acc := make([]string, len(e.Accepted))
	for i, v := range e.Accepted {
		acc[i] = string(v)
	}
	desc := string(e.Node.State)
	if e.Node.Busy() {
		desc += fmt.Sprintf(" (workflow running toward %s)", e.Node.Target)
	}
	if e.Node.Maintenance {
		desc += " in maintenance"
	}
	return fmt.Sprintf("%s refused: node is %s: %s; verbs accepted now: %s", e.Verb, desc, e.Why, strings.Join(acc, ", "))
}

// Decide applies verb v to node n. It is a pure function of the tables.
func Decide(n Node, v Verb) (Move, error) {
	r, ok := RuleOf(v)
	if !ok {
		return Move{}, fmt.Errorf("unknown verb %q: accepted are %s", v, joinVerbs(Verbs()))
	}
	refuse := func(why string) (Move, error) {
		return Move{}, &RefusedError{Verb: v, Node: n, Why: why, Accepted: Accepted(n)}
	}
	if v == VerbEnroll {
		return refuse("enroll creates a node; it does not apply to one")
	}
	if !slices.Contains(r.From, n.State) {
		return refuse(fmt.Sprintf("%s applies only in %s", v, joinStates(r.From)))
	}
	switch r.When {
	case WhenResting:
		if n.Busy() {
			return refuse("a workflow controls the node; abort it first")
		}
	case WhenBusy:
		if !n.Busy() {
			return refuse("no workflow is running")
		}
	}
	if n.Maintenance && !r.InMaintenance {
		return refuse("turn maintenance off first")
	}
	m := Move{From: n.State, To: r.To, Wakes: r.Wakes}
	switch v {
	case VerbRecover:
		to, ok := RecoverTarget(n.FailedFrom)
		if !ok {
			return refuse(fmt.Sprintf("the node failed from %q, which has no recover target", n.FailedFrom))
		}
		m.To = to
		m.Target = n.Target
		if n.FailedFrom == Deploying || m.Target == "" {
			// A failed deploy is released, which rests in ready; an unknown target rests
			// where the recovered workflow's chain normally ends.
			m.Target = defaultTarget(to)
		}
		m.ClearFault = true
	case VerbAbort:
		m.FailedFrom = n.State
		m.MaintenanceOn = true
		m.Fault = FaultAborted
		m.Target = n.Target
	case VerbDelete:
		if n.State == Failed && slices.Contains(deleteUnsafeFailedFrom, n.FailedFrom) {
			return refuse(fmt.Sprintf("it failed while %s and may hold a tenant's data or a half-done erase: recover or retire it first", n.FailedFrom))
		}
	}
	switch r.Target {
	case TargetFrom:
		m.Target = n.State
	case TargetKeep:
	default:
		m.Target = r.Target
	}
	if m.To == "" {
		m.To = n.State
		m.StateUnchanged = true
		if v != VerbRecover && v != VerbAbort {
			m.Target = n.Target
		}
	}
	return m, nil
}

// defaultTarget is the resting state a chain started in s ends in when nothing else is known.
func defaultTarget(s State) State {
	switch s {
	case Retiring:
		return Retired
	case Rescue:
		return Rescue
	default:
		return Ready
	}
}

// EnrollMove is the move that creates a node.
func EnrollMove() Move {
	r, _ := RuleOf(VerbEnroll)
	return Move{To: r.To, Target: r.Target, Wakes: true}
}

// Accepted lists the verbs the table accepts for n now, in table order.
func Accepted(n Node) []Verb {
	var out []Verb
	for _, r := range rules {
		if r.Verb == VerbEnroll {
			continue
		}
		if !slices.Contains(r.From, n.State) {
			continue
		}
		if r.When == WhenResting && n.Busy() || r.When == WhenBusy && !n.Busy() {
			continue
		}
		if n.Maintenance && !r.InMaintenance {
			continue
		}
		if r.Verb == VerbRecover {
			if _, ok := RecoverTarget(n.FailedFrom); !ok {
				continue
			}
		}
		if r.Verb == VerbDelete && n.State == Failed && slices.Contains(deleteUnsafeFailedFrom, n.FailedFrom) {
			continue
		}
		out = append(out, r.Verb)
	}
	return out
}

// Complete is where a node goes when the workflow of its state succeeded: the next state of the
// chain, and the target that remains (empty once resting). chainVerb is the verb that began the
// chain: an inspection that began at enroll goes on to commissioning, one begun by the inspect
// verb returns to its target.
func Complete(state, target State, chainVerb Verb) (next, nextTarget State, err error) {
	switch state {
	case Enrolling:
		return Inspecting, target, nil
	case Inspecting:
		if chainVerb == VerbEnroll {
			return Commissioning, target, nil
		}
		return target, "", nil
	case Commissioning, Deploying, Releasing, Retiring:
		return target, "", nil
	case Rescue:
		return target, "", nil
	}
	return "", "", fmt.Errorf("state %s has no workflow to complete", state)
}

// Fault codes raised on a failed node.
type Fault string

const (
	FaultStepFailed     Fault = "STEP_FAILED"
	FaultUnverifiedWipe Fault = "UNVERIFIED_WIPE"
	FaultFirmwareDrift  Fault = "FIRMWARE_DRIFT"
	// FaultBIOSDrift: after the reset that should have applied the pool's BIOS settings, the
	// BMC reports other values (it took the write and did not apply it).
	FaultBIOSDrift Fault = "BIOS_DRIFT"
	// FaultHardwareMismatch: the inventory an inspection reported does not meet the pool's
	// hardware requirements (a machine in the wrong pool, or hardware lost).
	FaultHardwareMismatch Fault = "HARDWARE_MISMATCH"
	FaultWorkflowTimeout  Fault = "WORKFLOW_TIMEOUT"
	FaultBMCUnreachable   Fault = "BMC_UNREACHABLE"
	FaultAborted          Fault = "ABORTED"
	FaultNoActiveWorkflow Fault = "NO_ACTIVE_WORKFLOW"
	// FaultBatchRejected: an approver rejected the destructive batch the node's chain waited for.
	FaultBatchRejected Fault = "BATCH_REJECTED"
	// MAC binding of a node enrolled with a product UUID and no MAC (DESIGN §6 Discovery):
	// nothing PXE-booted under its UUID within the window after the power cycle; more than one
	// MAC came from that UUID; the MAC belongs to another node; the candidate was not confirmed
	// in time.
	FaultMACNotDiscovered Fault = "MAC_NOT_DISCOVERED"
	FaultMACAmbiguous     Fault = "MAC_AMBIGUOUS"
	FaultMACConflict      Fault = "MAC_CONFLICT"
	FaultMACUnconfirmed   Fault = "MAC_UNCONFIRMED"
	// FaultReconcileFailed: the reconciler failed on the node every time it tried, 8 times in a
	// row over at least 2 minutes (a row it cannot read, a profile it cannot resolve, a bug): a
	// workflow-driven node fails (its workflow aborted), a resting one keeps its state; either
	// way maintenance holds it until an operator clears it (recover, or maintenance off).
	FaultReconcileFailed Fault = "RECONCILE_FAILED"
)

// Faults lists every fault code.
func Faults() []Fault {
	return []Fault{FaultStepFailed, FaultUnverifiedWipe, FaultFirmwareDrift, FaultBIOSDrift, FaultHardwareMismatch, FaultWorkflowTimeout, FaultBMCUnreachable, FaultAborted, FaultNoActiveWorkflow, FaultBatchRejected,
		FaultMACNotDiscovered, FaultMACAmbiguous, FaultMACConflict, FaultMACUnconfirmed, FaultReconcileFailed}
}

// Fail is where a node goes when its workflow failed: failed, failed_from its state, maintenance
// on, the target kept so recover knows where the chain was heading.
func Fail(n Node, code Fault) Move {
	return Move{From: n.State, To: Failed, Target: n.Target, FailedFrom: n.State, MaintenanceOn: true, Fault: code}
}

func joinStates(ss []State) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return strings.Join(out, ", ")
}

func joinVerbs(vs []Verb) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return strings.Join(out, ", ")
}
