// Package batch holds the decisions of destructive-command batches (DESIGN §7) as pure
// functions: the subject of a command (batchSubject), the leaves a batch's scope lists
// (metalBatchScope), the chain of workflows a verb starts (verbChain), whether the command queue
// may send a destructive command (the gate), and the life of a batch under approvals,
// withdrawals and rejections. Nothing here does I/O.
package batch

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"bcd/internal/command"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// MaxBulk is the most nodes one metal.bulk takes.
const MaxBulk = 10000

// BulkVerbs are the verbs metal.bulk applies.
var BulkVerbs = []provision.Verb{provision.VerbManage, provision.VerbInspect, provision.VerbProvide, provision.VerbDeploy, provision.VerbUndeploy, provision.VerbRescue, provision.VerbRetire}

// Subject is batchSubject: the subject of a command of kind k on node nodeID, relayed through
// site agent agentID (empty for ramdisk work). The subject follows where the command runs: the
// node's own work, run by its ramdisk (disk.wipe, deploy.image, boot.kexec, and
// bmc.provisionInband, which reaches the BMC from the host before its address is known), is the
// node; BMC work a site agent runs is bmc:<site agent>/<BMC address>; site.httpProxy is
// node:<target>.
func Subject(k command.Kind, nodeID, bmcAddress, agentID string) string {
	switch {
	case k.Name == "site.httpProxy":
		return "node:" + nodeID
	case siteBMC(k):
		return "bmc:" + agentID + "/" + bmcAddress
	}
	return nodeID
}

// siteBMC reports whether k is BMC work a site agent runs (its subject is the BMC, one leaf per
// site agent).
func siteBMC(k command.Kind) bool {
	return strings.HasPrefix(k.Name, "bmc.") && k.RunsOn == command.OnSite
}

// AgentSubject turns a stored command subject into the leaf subject for the agent about to
// receive it: "bmc:<address>" becomes "bmc:<agent>/<address>"; other subjects are unchanged.
func AgentSubject(stored, agentID string) string {
	if addr, ok := strings.CutPrefix(stored, "bmc:"); ok {
		return "bmc:" + agentID + "/" + addr
	}
	return stored
}

// Target is one node of a scope with the command kinds its workflows may send.
type Target struct {
	NodeID, BMCAddress string
	Kinds              []string
}

// Scope is metalBatchScope: every destructive (subject, kind) leaf of the targets. BMC work gets
// one leaf per site agent of the site, so a command rerouted to another agent (failover) stays
// covered. Non-destructive kinds need no leaf. Unknown kinds are an error.
func Scope(targets []Target, siteAgents []string) ([]store.Leaf, error) {
	var out []store.Leaf
	for _, t := range targets {
		for _, name := range t.Kinds {
			k, err := command.Lookup(name)
			if err != nil {
				return nil, err
			}
			if !k.Destructive {
				continue
			}
			if siteBMC(k) {
				for _, a := range siteAgents {
					out = append(out, store.Leaf{Subject: Subject(k, t.NodeID, t.BMCAddress, a), Kind: k.Name})
				}
				continue
			}
			out = append(out, store.Leaf{Subject: Subject(k, t.NodeID, t.BMCAddress, ""), Kind: k.Name})
		}
	}
	return out, nil
}

// Chain is verbChain: the workflow-driven states a node in state, resting at target, goes
// through (state first) when every workflow succeeds. chainVerb is the verb that began the
// chain (an inspection begun at enroll goes on to commissioning).
func Chain(state, target provision.State, chainVerb provision.Verb) []provision.State {
	var out []provision.State
	for range 8 {
		info, ok := provision.Info(state)
		if !ok || info.Kind == provision.Resting || target == "" {
			return out
		}
		out = append(out, state)
		next, nextTarget, err := provision.Complete(state, target, chainVerb)
		if err != nil || nextTarget == "" {
			return out
		}
		state, target = next, nextTarget
	}
	return out
}

// ProfileOf finds the profile a state runs (deploying: the node's deploy profile).
type ProfileOf func(state, target provision.State) (workflow.Profile, error)

// ChainKinds is every command kind the workflows of chain may send, resolved with params.
func ChainKinds(chain []provision.State, target provision.State, profileOf ProfileOf, params map[string]string) ([]string, error) {
	var kinds []string
	for _, s := range chain {
		p, err := profileOf(s, target)
		if err != nil {
			return nil, fmt.Errorf("profile of %s: %w", s, err)
		}
		res, err := workflow.Resolve(p, params)
		if err != nil {
			return nil, err
		}
		for _, k := range res.CommandKinds {
			if !slices.Contains(kinds, k) {
				kinds = append(kinds, k)
			}
		}
	}
	slices.Sort(kinds)
	return kinds, nil
}

// BuiltinProfileOf resolves a state's built-in (or configured) profile; deploying has none.
func BuiltinProfileOf(extra []workflow.Profile) ProfileOf {
	return func(state, target provision.State) (workflow.Profile, error) {
		info, ok := provision.Info(state)
		if !ok {
			return workflow.Profile{}, fmt.Errorf("unknown state %q", state)
		}
		name := info.Profile(target)
		if name == "" {
			return workflow.Profile{}, fmt.Errorf("state %s runs the node's deploy profile", state)
		}
		return workflow.Find(name, extra)
	}
}

// Destructive reports whether any of kinds is destructive.
func Destructive(kinds []string) bool {
	for _, name := range kinds {
		if k, err := command.Lookup(name); err == nil && k.Destructive {
			return true
		}
	}
	return false
}

// RefusedError is a destructive command the queue will not send.
type RefusedError struct{ Why string }

func (e *RefusedError) Error() string { return "refused: " + e.Why }

// Gate decides whether the command queue may send a destructive command whose leaf is
// (subject, kind): required is the approvals the node's policy requires now; b is the
// command's batch (nil when it has none), approvals its approval count, and inScope whether its
// scope lists the leaf. deadline is b's approval deadline (Deadline): a batch approved after it
// (by a server whose --approval-timeout is longer) opens nothing.
func Gate(required int, b *store.Batch, approvals int, inScope bool, subject, kind string, deadline int64) error {
	if required <= 0 {
		return nil
	}
	if b == nil {
		return &RefusedError{Why: fmt.Sprintf("%s on %s is destructive and %d approvals are required: it is outside any batch", kind, subject, required)}
	}
	switch b.State {
	case store.BatchApproved, store.BatchRunning:
	default:
		return &RefusedError{Why: fmt.Sprintf("batch %s is %s, not approved", b.ID, b.State)}
	}
	if b.State == store.BatchApproved && ApprovedLate(*b, deadline) {
		return &RefusedError{Why: fmt.Sprintf("batch %s was approved at %s, after it expired at %s: request a new one", b.ID, Stamp(b.DecidedAt), Stamp(deadline))}
	}
	if approvals < required {
		return &RefusedError{Why: fmt.Sprintf("batch %s has %d approvals; %d are required now", b.ID, approvals, required)}
	}
	if !inScope {
		return &RefusedError{Why: fmt.Sprintf("batch %s does not list (%s, %s) in its scope", b.ID, subject, kind)}
	}
	return nil
}

// DefaultApprovalTimeout is how long a batch may wait for its approvals unless the server is
// told otherwise (--approval-timeout).
const DefaultApprovalTimeout = 7 * 24 * time.Hour

// Deadline is when batch b, not approved by then, expires (store microseconds): timeout after
// its creation.
func Deadline(b store.Batch, timeout time.Duration) int64 {
	return b.CreatedAt + timeout.Microseconds()
}

// ApprovedLate reports whether b was approved at or after its deadline.
func ApprovedLate(b store.Batch, deadline int64) bool {
	return b.DecidedAt != 0 && b.DecidedAt >= deadline
}

// Stamp formats a store time (microseconds) for messages: RFC 3339, UTC.
func Stamp(micros int64) string {
	return time.UnixMicro(micros).UTC().Format(time.RFC3339)
}

// DecisionError is an approval, withdrawal or rejection the batch's state refuses.
type DecisionError struct{ Msg string }

func (e *DecisionError) Error() string { return e.Msg }

// SelfApprovalError is a requester approving their own batch.
type SelfApprovalError struct{ Msg string }

func (e *SelfApprovalError) Error() string { return e.Msg }

// Approve decides an approval of b by approver, who holds approvals among the approvals
// already recorded (approvals counts them): the batch's next state. now and deadline are the
// time and b's approval deadline (Deadline): a pending batch past it is expired, whether or not
// the engine has recorded that yet.
func Approve(b store.Batch, approver string, approvals int, already bool, now, deadline int64) (string, error) {
	if approver == b.RequestedBy {
		return "", &SelfApprovalError{Msg: fmt.Sprintf("%s requested batch %s and cannot approve it: another approver must", approver, b.ID)}
	}
	switch b.State {
	case store.BatchRejected:
		return "", &DecisionError{Msg: fmt.Sprintf("batch %s was rejected by %s: request a new one", b.ID, b.DecidedBy)}
	case store.BatchCancelled:
		return "", &DecisionError{Msg: fmt.Sprintf("batch %s was cancelled: its nodes left it before it was approved", b.ID)}
	case store.BatchRunning, store.BatchApproved:
		return "", &DecisionError{Msg: fmt.Sprintf("batch %s is already %s (%d of %d approvals)", b.ID, b.State, approvals, b.Required)}
	}
	if now >= deadline {
		return "", &DecisionError{Msg: fmt.Sprintf("batch %s expired at %s (not approved within bcd server --approval-timeout): nothing of it runs; request a new one", b.ID, Stamp(deadline))}
	}
	if already {
		return "", &DecisionError{Msg: fmt.Sprintf("%s already approved batch %s (%d of %d approvals)", approver, b.ID, approvals, b.Required)}
	}
	if approvals+1 >= b.Required {
		return store.BatchApproved, nil
	}
	return store.BatchPending, nil
}

// Withdraw decides the withdrawal of approver's approval: allowed until the batch starts.
// Below the quorum an approved batch is pending again (Rehold: what it released waits again).
func Withdraw(b store.Batch, had bool, approvalsAfter int) (string, error) {
	switch b.State {
	case store.BatchRunning:
		return "", &DecisionError{Msg: fmt.Sprintf("batch %s already started: an approval can be withdrawn only before; abort its nodes instead", b.ID)}
	case store.BatchRejected, store.BatchCancelled:
		return "", &DecisionError{Msg: fmt.Sprintf("batch %s was %s: nothing to withdraw", b.ID, b.State)}
	}
	if !had {
		return "", &DecisionError{Msg: fmt.Sprintf("you have not approved batch %s", b.ID)}
	}
	if b.Required > 0 && approvalsAfter < b.Required {
		return store.BatchPending, nil
	}
	return b.State, nil
}

// Rehold reports whether a batch going from state from to state to holds again the commands
// its approval released that no agent took yet: an approved batch withdrawn below its quorum.
// Left queued, the gate would fail them; held, they wait for the batch as they did before.
func Rehold(from, to string) bool {
	return from == store.BatchApproved && to == store.BatchPending
}

// Reject decides a rejection: allowed until the batch starts.
func Reject(b store.Batch) error {
	switch b.State {
	case store.BatchRunning:
		return &DecisionError{Msg: fmt.Sprintf("batch %s already started: it can no longer be rejected; abort its nodes instead", b.ID)}
	case store.BatchRejected, store.BatchCancelled:
		return &DecisionError{Msg: fmt.Sprintf("batch %s is already %s", b.ID, b.State)}
	}
	return nil
}

// RejectedReturn is where a node whose batch was rejected goes: back to the resting state its
// verb came from when that is a working state (nothing ran), else failed with BATCH_REJECTED
// (a chain begun at enroll, or a recovery from failed).
func RejectedReturn(verbFrom provision.State) (provision.State, bool) {
	switch verbFrom {
	case provision.Manageable, provision.Ready, provision.Deployed, provision.Rescue:
		return verbFrom, true
	}
	return "", false
}
