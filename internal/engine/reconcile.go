package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"bcd/internal/command"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// Workflow states.
const (
	wfRunning   = "running"   // steps
	wfCleaning  = "cleaning"  // cleanup steps, the outcome already decided
	wfSucceeded = "succeeded" // final
	wfFailed    = "failed"    // final
	wfAborted   = "aborted"   // final
)

// run is one reconciliation of one node inside one transaction.
type run struct {
	e       *Engine
	tx      *store.Tx
	ctx     context.Context
	notices []notice
	// finished are the workflows this run ended (for the Observer, once committed).
	finished []store.Workflow
	// cancelled are the commands this run gave up while an agent held them: the agent is told
	// to cancel them once committed (Engine.Cancels).
	cancelled []store.Command
	n         store.Node
	// wf is the node's open workflow as this run last read or changed it (wfLoaded), its row
	// written back by flushWorkflow (wfDirty): the run alone changes it, so the decisions of
	// one run read it once and write it once however many steps they take.
	wf                        store.Workflow
	wfLoaded, wfOpen, wfDirty bool
	// cmds are the commands this run read or wrote (a run touches one or two: a slice costs
	// the collector less than a map); batches likewise, by id.
	cmds    []store.Command
	batches map[string]store.Batch
	// events are appended together when the run ends (flush), in the order taken.
	events []store.Event
	// pool is the node's pool once read (nodePool).
	pool *store.Pool
	// rotationSettled: the run knows no BMC credential rotation can have finished since the
	// node's last reconciliation (see reconcileIn), so it does not look for one.
	rotationSettled bool
	// locked is the node's row as the run's transaction locked and read it before the run,
	// if it did.
	locked *store.Node
}

const maxActions = 64

// node reconciles nodeID and returns how long until it must be looked at again (0: only when
// woken).
func (r *run) node(nodeID string) (time.Duration, error) {
	var n store.Node
	var err error
	if r.locked != nil && r.locked.ID == nodeID {
		n = *r.locked
	} else {
		n, err = r.tx.LockNode(r.ctx, nodeID, "")
	}
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil // deleted
	}
	if err != nil {
		return 0, err
	}
	r.n = n
	if !r.rotationSettled {
		if err := r.rotation(); err != nil {
			return 0, err
		}
	}
	for range maxActions {
		again, more, err := r.step()
		if err != nil {
			return 0, err
		}
		if !more {
			return again, r.flush()
		}
	}
	return time.Second, r.flush() // a long chain of immediate decisions: continue shortly
}

// effects is what the run leaves to do once its transaction has committed.
func (r *run) effects() effects {
	return effects{notices: r.notices, finished: r.finished, cancelled: r.cancelled}
}

// flush writes what the run kept to write once: its workflow row and its events.
func (r *run) flush() error {
	if err := r.flushWorkflow(); err != nil {
		return err
	}
	evs := r.events
	r.events = nil
	return r.tx.AppendEvents(r.ctx, evs)
}

// openWorkflow returns the node's open workflow: the run's copy while it is open, else read.
// Once the run applied the outcome of the open workflow it holds, the node has none (written
// first, for what reads the workflows next): only startWorkflow opens one, when none is open,
// under the node's lock (SQLite's one writer; PostgreSQL's row lock).
func (r *run) openWorkflow() (*store.Workflow, bool, error) {
	if r.wfLoaded && (!r.wfOpen || !r.wf.OutcomeApplied) {
		return &r.wf, r.wfOpen, nil
	}
	if err := r.flushWorkflow(); err != nil {
		return nil, false, err
	}
	if r.wfLoaded {
		r.wfOpen = false
		return &r.wf, false, nil
	}
	wf, open, err := r.tx.OpenWorkflow(r.ctx, r.n.ID)
	if err != nil {
		return nil, false, err
	}
	r.wf, r.wfLoaded, r.wfOpen = wf, true, open
	return &r.wf, open, nil
}

// saveWorkflow records that the run changed its workflow (wf is &r.wf); flushWorkflow writes
// it.
func (r *run) saveWorkflow(wf *store.Workflow) error {
	if wf != &r.wf {
		return fmt.Errorf("workflow %s is not the node's open workflow", wf.ID)
	}
	r.wfDirty = true
	return nil
}

func (r *run) flushWorkflow() error {
	if !r.wfDirty {
		return nil
	}
	r.wfDirty = false
	return r.tx.UpdateWorkflow(r.ctx, &r.wf)
}

// command reads a command once per run.
func (r *run) command(id string) (store.Command, error) {
	for _, c := range r.cmds {
		if c.ID == id {
			return c, nil
		}
	}
	c, err := r.tx.Command(r.ctx, id)
	if err != nil {
		return c, err
	}
	r.keep(c)
	return c, nil
}

// keep remembers a command as the run read or wrote it.
func (r *run) keep(c store.Command) {
	for i := range r.cmds {
		if r.cmds[i].ID == c.ID {
			r.cmds[i] = c
			return
		}
	}
	r.cmds = append(r.cmds, c)
}

// updateCommand writes a command and keeps the run's copy.
func (r *run) updateCommand(c *store.Command) error {
	if err := r.tx.UpdateCommand(r.ctx, c); err != nil {
		return err
	}
	r.keep(*c)
	return nil
}

// step takes one decision. more says whether another decision may follow at once.
func (r *run) step() (again time.Duration, more bool, err error) {
	n := &r.n
	pn := provisionNode(*n)
	wf, open, err := r.openWorkflow()
	if err != nil {
		return 0, false, err
	}
	switch {
	case open && (wf.State == wfSucceeded || wf.State == wfFailed || wf.State == wfAborted):
		return 0, true, r.applyOutcome(wf)
	case open && wf.NodeState != n.State && wf.State == wfRunning:
		// The node left the workflow's state (abort, or a verb after a crash): stop it, run its
		// cleanup.
		return 0, true, r.abortWorkflow(wf, "node moved to "+n.State)
	case open && wf.AbortRequested && wf.State == wfRunning:
		// Aborted, and recovered into the same state before this reconciliation: the abort
		// still stops the step and runs the cleanup; the recover's new workflow follows.
		return 0, true, r.abortWorkflow(wf, "aborted by an operator")
	case open:
		if n.Maintenance && wf.State == wfRunning {
			return 0, false, nil // maintenance holds the workflow until it is turned off
		}
		return r.advance(wf)
	case pn.Busy() && !n.Maintenance:
		return 0, true, r.startWorkflow()
	case !pn.Busy() && n.BatchID != "":
		// The node rests: its batch is no longer parked on it.
		return 0, true, r.unpark()
	case n.LingerUntil != 0 || n.LingerCommand != "":
		// No workflow holds the node (a busy node in maintenance waits for its workflow).
		return r.linger(pn.Busy())
	}
	return 0, false, nil
}

func provisionNode(n store.Node) provision.Node {
	return provision.Node{State: provision.State(n.State), Target: provision.State(n.TargetState), FailedFrom: provision.State(n.FailedFrom), Maintenance: n.Maintenance}
}

func (r *run) event(kind, from, to, reason string, data map[string]any) error {
	r.addEvent(kind, from, to, reason, eventJSON(data))
	return nil
}

// addEvent is event with its data encoded.
func (r *run) addEvent(kind, from, to, reason, data string) {
	r.events = append(r.events, store.Event{TenantID: r.n.TenantID, NodeID: r.n.ID, Actor: "reconciler", Kind: kind,
		FromState: from, ToState: to, Reason: reason, Data: data})
}

// profileSource names the workflow of the node's state, and the definition stored through the
// API that takes its place (stored false: the built-in or configured profile of that name).
func (r *run) profileSource() (name, def string, stored bool, err error) {
	n := r.n
	info, ok := provision.Info(provision.State(n.State))
	if !ok {
		return "", "", false, fmt.Errorf("node %s is in unknown state %q", n.ID, n.State)
	}
	name = info.Profile(provision.State(n.TargetState))
	if n.State == string(provision.Enrolling) && n.BMCAddress == "" {
		name = workflow.InbandEnrollProfile // accepted --inband: its ramdisk makes the BMC credential
	}
	if n.State == string(provision.Deploying) {
		name = n.DeployProfile
	}
	// Operator profiles (and overrides of built-in ones) stored through the API take precedence
	// over configured ones.
	def, stored, err = r.storedProfile(name)
	return name, def, stored, err
}

// startable is a workflow profile resolved for a node's parameters, with the JSON of its steps
// that the workflow's row stores.
type startable struct {
	res            workflow.Resolved
	steps, cleanup string
}

// maxStartables bounds the resolved profiles an engine keeps (a few per profile in use: one per
// wipe mode and deploy image).
const maxStartables = 1024

// resolveWorkflow resolves the workflow of the node's state for its parameters. What it gives
// depends on the profile's name, its stored definition and the parameters alone (configured
// profiles are fixed for the engine's life), so it is kept under them (Engine.startables): a
// workflow started in the single writer does not expand and encode the same profile again.
// res.CommandKinds is shared by every workflow of the same key: read-only.
func (r *run) resolveWorkflow() (startable, error) {
	name, def, stored, err := r.profileSource()
	if err != nil {
		return startable{}, err
	}
	params := map[string]string{"wipe": r.n.WipeMode, "image": r.n.DeployImage}
	key := keptKey(name, strconv.FormatBool(stored), def, params["wipe"], params["image"])
	if s, ok := r.e.startables.Get(key); ok {
		return s, nil
	}
	var p workflow.Profile
	if stored {
		p, err = workflow.ParseProfile(name, []byte(def))
	} else {
		p, err = workflow.Find(name, r.e.cfg.Profiles)
	}
	if err != nil {
		return startable{}, err
	}
	res, err := workflow.Resolve(p, params)
	if err != nil {
		return startable{}, err
	}
	res.CommandKinds = slices.Clip(res.CommandKinds) // an append by a reader copies
	steps, err := json.Marshal(res.Steps)
	if err != nil {
		return startable{}, fmt.Errorf("encoding the steps of %s: %w", res.Profile, err)
	}
	cleanup, err := json.Marshal(res.Cleanup)
	if err != nil {
		return startable{}, fmt.Errorf("encoding the cleanup of %s: %w", res.Profile, err)
	}
	s := startable{res: res, steps: string(steps), cleanup: string(cleanup)}
	r.e.startables.Put(key, s)
	return s, nil
}

// keptKey joins parts into one key of what the engine keeps, each length-prefixed so that no two
// lists of parts give the same key. Pure.
func keptKey(parts ...string) string {
	var key strings.Builder
	for _, part := range parts {
		key.WriteString(strconv.Itoa(len(part)))
		key.WriteByte(':')
		key.WriteString(part)
	}
	return key.String()
}

func (r *run) startWorkflow() error {
	n := &r.n
	st, err := r.resolveWorkflow()
	res := st.res
	if err != nil {
		return r.failNode(provision.FaultStepFailed, fmt.Sprintf("cannot start the workflow of %s: %v", n.State, err))
	}
	if err := r.endLinger(res.Profile); err != nil {
		return err
	}
	// An operator's power action still held for approval, or queued, would run in the middle of
	// the workflow's steps (the power verb is refused while a workflow controls the node).
	withdrawn, err := r.tx.WithdrawDirectCommands(r.ctx, n.ID, "withdrawn: workflow "+res.Profile+" took the node before an agent took this command")
	if err != nil {
		return err
	}
	for _, c := range withdrawn {
		if err := r.event("command.withdrawn", n.State, n.State, "workflow "+res.Profile+" took the node before an agent took "+c[1],
			map[string]any{"command": c[0], "kind": c[1], "profile": res.Profile}); err != nil {
			return err
		}
	}
	batchID, err := r.batchFor(res)
	if err != nil {
		return r.failNode(provision.FaultStepFailed, fmt.Sprintf("cannot compute the destructive scope of %s: %v", res.Profile, err))
	}
	wf := store.Workflow{NodeID: n.ID, TenantID: n.TenantID, Profile: res.Profile, Owner: "metal", NodeState: n.State,
		Steps: st.steps, Cleanup: st.cleanup, CommandKinds: res.CommandKinds, State: wfRunning, Phase: "steps", BatchID: batchID}
	if err := r.flushWorkflow(); err != nil {
		return err
	}
	if err := r.tx.InsertWorkflow(r.ctx, &wf); err != nil {
		return err
	}
	r.wf, r.wfLoaded, r.wfOpen = wf, true, true
	return r.event("workflow.start", n.State, n.State, "", map[string]any{"workflow": wf.ID, "profile": res.Profile, "steps": len(res.Steps)})
}

func (r *run) abortWorkflow(wf *store.Workflow, why string) error {
	wf.AbortRequested = true
	if wf.FaultCode == "" {
		wf.FaultCode = string(provision.FaultAborted)
		wf.Error = why
	}
	if err := r.cancelCurrent(wf, "workflow aborted: "+why); err != nil {
		return err
	}
	r.toCleanup(wf)
	if err := r.saveWorkflow(wf); err != nil {
		return err
	}
	return r.event("workflow.abort", r.n.State, r.n.State, why, map[string]any{"workflow": wf.ID, "profile": wf.Profile})
}

// cancelCurrent gives up on the running step's command: one never delivered is withdrawn; one
// already delivered is marked failed here and the agent is told to cancel (it may be
// uninterruptible: its late result is ignored).
func (r *run) cancelCurrent(wf *store.Workflow, why string) error {
	if wf.CurrentCommand == "" {
		return nil
	}
	c, err := r.command(wf.CurrentCommand)
	if err != nil {
		return err
	}
	if command.State(c.State).Final() {
		return nil
	}
	held := c.TargetAgent != ""
	c.State, c.Error, c.FinishedAt = string(command.Failed), why, r.tx.At()
	r.notify(c)
	if held {
		r.cancelled = append(r.cancelled, c)
	}
	return r.updateCommand(&c)
}

func (r *run) toCleanup(wf *store.Workflow) {
	wf.State, wf.Phase = wfCleaning, "cleanup"
	wf.StepIndex, wf.StepAttempt, wf.StepStartedAt, wf.StepDeadline, wf.CurrentCommand = 0, 0, 0, 0, ""
}

// advance runs the workflow's current step as far as it can go now.
func (r *run) advance(wf *store.Workflow) (time.Duration, bool, error) {
	steps, err := r.e.stepsOf(wf)
	if err != nil {
		return 0, false, err
	}
	if wf.StepIndex >= len(steps) {
		if wf.Phase == "steps" {
			r.toCleanup(wf)
			return 0, true, r.saveWorkflow(wf)
		}
		return 0, true, r.finish(wf)
	}
	st := steps[wf.StepIndex]
	kind, err := workflow.LookupStep(st.Use)
	if err != nil {
		return 0, true, r.stepFailed(wf, st, provision.FaultStepFailed, err.Error(), false)
	}
	now := r.tx.At()
	if wf.StepStartedAt == 0 {
		if hold, due, err := r.held(wf); err != nil || hold {
			// Pending: woken when the batch is decided, or at its approval deadline. Rejected:
			// the workflow ended.
			return due, err == nil && wf.OutcomeApplied, err
		}
		// Decided once, at the group's first step: within a group that ran, a connected ramdisk
		// may be the previous boot's.
		if st.FastTrack && (wf.StepIndex == 0 || !steps[wf.StepIndex-1].FastTrack) {
			up, err := r.ramdiskUp()
			if err != nil {
				return 0, false, err
			}
			if up {
				// The whole group at once: a ramdisk that leaves half-way must not find a
				// power cycle without its boot entry.
				for wf.StepIndex < len(steps) && steps[wf.StepIndex].FastTrack {
					if err := r.stepSkipped(wf, steps[wf.StepIndex], "fast track: the node's ramdisk is up"); err != nil {
						return 0, false, err
					}
				}
				return 0, true, nil
			}
		}
		facts, err := r.facts(wf, st.When)
		if err != nil {
			return 0, false, err
		}
		if !st.When.Holds(facts) {
			return 0, true, r.conditionUnmet(wf, st) // overrides.go
		}
		return 0, true, r.startStep(wf, st, kind)
	}
	// A step in progress: its command, its await, its deadline.
	clock := stepClock{Now: now, StartedAt: wf.StepStartedAt, Deadline: wf.StepDeadline, Timeout: st.Timeout, QueueTimeout: r.e.cfg.QueueTimeout}
	if wf.CurrentCommand != "" {
		c, err := r.command(wf.CurrentCommand)
		if err != nil {
			return 0, false, err
		}
		clock.Command, clock.Taken, clock.TakenAt = true, c.State != string(command.Queued), c.DeliveredAt
		state := command.State(c.State)
		switch {
		case c.Kind == workflow.LostCheckCommand && kind.Command != workflow.LostCheckCommand:
			// The query settling the step's lost command: decide once it answered.
			if state.Final() {
				return 0, true, r.settleLost(wf, st, kind, c)
			}
		case state == command.Succeeded:
			if kind.Await == workflow.AwaitNone {
				if err := r.takeResult(wf, st, c); err != nil {
					fault := provision.FaultStepFailed
					if c.Kind == "disk.wipe" {
						fault = provision.FaultUnverifiedWipe // not attested, or a disk did not read back
					}
					fault = driftFault(err, fault) // FIRMWARE_DRIFT, BIOS_DRIFT, HARDWARE_MISMATCH
					return 0, true, r.stepFailed(wf, st, fault, err.Error(), false)
				}
				return 0, true, r.stepDone(wf, st, c.ID)
			}
		case state == command.Failed, state == command.Lost:
			if kind.Await == workflow.AwaitRejoin && state == command.Lost {
				break // kexec never reports: its agent leaves, the OS rejoins
			}
			msg := fmt.Sprintf("%s %s: %s", c.Kind, c.State, c.Error)
			if kind.FallBack {
				return 0, true, r.fallBack(wf, st, msg)
			}
			if check, ok := workflow.LostCheckFor(kind, st); ok && state == command.Lost && slices.Contains(wf.CommandKinds, workflow.LostCheckCommand) {
				return 0, true, r.checkLost(wf, st, c, check)
			}
			if state == command.Lost && c.RunsOn == string(command.OnRamdisk) {
				// Its ramdisk went away holding it: a retry as it is waits for a ramdisk only
				// if one came back.
				gone, err := r.ramdiskGone(c, now)
				if err != nil {
					return 0, false, err
				}
				if gone {
					return 0, true, r.ramdiskLost(wf, st, msg)
				}
			}
			if state == command.Lost && !workflow.RetryLost(kind, st) {
				// It may have run, and nothing tells: never sent a second time.
				msg += "; it may have run, and a power action is never sent twice: not retried"
				return 0, true, r.stepFailed(wf, st, provision.FaultStepFailed, msg, false)
			}
			return 0, true, r.stepFailed(wf, st, provision.FaultStepFailed, msg, true)
		case state == command.Queued && c.RunsOn == string(command.OnRamdisk):
			// Waiting for the node's ramdisk longer than an agent may take to come back: gone
			// (crashed, or its host hung) means it never comes; the step ends then, not at its
			// deadline (up to a day for a wipe). Until then, look again at that time.
			if grace := r.e.cfg.AgentGrace.Microseconds(); now-wf.StepStartedAt < grace {
				// Due again when the grace ends, or at the step's next look (stepDue) if that
				// comes first: never at a time already past (a step timeout shorter than the
				// grace), which would leave the node with no wake-up at all.
				v := stepDue(clock)
				if !v.Expired {
					return time.Duration(min(v.Next, wf.StepStartedAt+grace)-now) * time.Microsecond, false, nil
				}
				break // out of time: ended below
			}
			gone, err := r.ramdiskGone(c, now)
			if err != nil {
				return 0, false, err
			}
			if !gone {
				break
			}
			msg := fmt.Sprintf("the node's ramdisk went away before it took %s (gone longer than %s)", c.Kind, r.e.cfg.AgentGrace)
			if err := r.cancelCurrent(wf, msg); err != nil {
				return 0, false, err
			}
			if kind.FallBack {
				return 0, true, r.fallBack(wf, st, msg)
			}
			return 0, true, r.ramdiskLost(wf, st, msg)
		}
	}
	if kind.Await == workflow.AwaitMAC {
		return r.awaitMAC(wf, st)
	}
	if kind.Await != workflow.AwaitNone {
		agentKind := "node"
		if kind.Await == workflow.AwaitRejoin {
			agentKind = "os"
		}
		since, err := r.tx.NodeAgentConnectedSince(r.ctx, r.n.ID, agentKind, r.n.IdentityGeneration)
		if err != nil {
			return 0, false, err
		}
		epoch := wf.BootEpoch
		if epoch == 0 {
			epoch = wf.StepStartedAt
		}
		if since >= epoch {
			return 0, true, r.stepDone(wf, st, wf.CurrentCommand)
		}
	}
	v := stepDue(clock)
	if !v.Expired {
		return time.Duration(v.Next-now) * time.Microsecond, false, nil
	}
	if err := r.cancelCurrent(wf, "step timed out"); err != nil {
		return 0, false, err
	}
	msg := fmt.Sprintf("step %s %s", st, v.Reason)
	if kind.FallBack {
		return 0, true, r.fallBack(wf, st, msg)
	}
	return 0, true, r.stepFailed(wf, st, provision.FaultWorkflowTimeout, msg, true)
}

func (r *run) startStep(wf *store.Workflow, st workflow.Step, kind workflow.StepKind) error {
	now := r.tx.At()
	wf.StepAttempt++
	wf.StepStartedAt = now
	wf.StepDeadline = now + st.Timeout.Microseconds()
	wf.CurrentCommand = ""
	switch {
	case kind.ControlPlane:
		if err := r.controlPlane(st); err != nil {
			return r.stepFailed(wf, st, provision.FaultStepFailed, err.Error(), false)
		}
		return r.stepDone(wf, st, "")
	case kind.Command != "":
		if !slices.Contains(wf.CommandKinds, kind.Command) {
			return r.stepFailed(wf, st, provision.FaultStepFailed,
				fmt.Sprintf("step %s sends %s, which profile %s does not declare (it may send %s)", st, kind.Command, wf.Profile, strings.Join(wf.CommandKinds, ", ")), false)
		}
		c, err := r.buildCommand(wf, st, kind.Command)
		if err != nil {
			return r.stepFailed(wf, st, provision.FaultStepFailed, err.Error(), false)
		}
		if err := r.tx.InsertCommand(r.ctx, &c); err != nil {
			return err
		}
		r.keep(c) // the next decision looks at it: no need to read back what was just written
		wf.CurrentCommand = c.ID
		if c.Kind == "bmc.power" || c.Kind == "boot.kexec" || c.Kind == "boot.prepareRamdisk" && wf.Profile == workflow.InbandEnrollProfile {
			// What joins from now on belongs to this boot (in-band enrollment: the waiting
			// discovery-mode ramdisk joins with this entry's token, no power cycle).
			wf.BootEpoch = now
		}
		r.notify(c)
	}
	return r.saveWorkflow(wf)
}

// ramdiskUp reports whether the node's ramdisk is connected under the current identity
// generation, joined after the node's last power action or kexec, and the node is powered on. A
// machine that was reset or powered off leaves a dead connection behind until its heartbeats
// time out: the last boot command and the power axis rule those out.
func (r *run) ramdiskUp() (bool, error) {
	if r.n.Power != "on" {
		return false, nil
	}
	since, err := r.tx.NodeAgentConnectedSince(r.ctx, r.n.ID, "node", r.n.IdentityGeneration)
	if err != nil || since == 0 {
		return false, err
	}
	boot, err := r.tx.LastBootCommandAt(r.ctx, r.n.ID)
	return FastTrackable(r.n.Power, since, boot), err
}

// ramdiskGone reports whether the node's ramdisk of c's generation is gone: none connected, and
// none seen within the agents' grace period before now.
func (r *run) ramdiskGone(c store.Command, now int64) (bool, error) {
	return r.tx.NodeAgentGone(r.ctx, r.n.ID, "node", c.Generation, now-r.e.cfg.AgentGrace.Microseconds())
}

// FastTrackable decides whether a node's ramdisk can be used as it is: powered on, and its
// ramdisk joined (connectedAt, 0 when not connected) after the last command that made the node
// boot (lastBoot). Pure.
func FastTrackable(power string, connectedAt, lastBoot int64) bool {
	return power == "on" && connectedAt > 0 && connectedAt > lastBoot
}

// fallBack moves past a step that failed or ran out of time to the fallback steps after it
// (boot.kexec: a BMC power cycle into the disk), recording why.
func (r *run) fallBack(wf *store.Workflow, st workflow.Step, why string) error {
	if err := r.event("workflow.step", r.n.State, r.n.State, why+"; falling back", map[string]any{"workflow": wf.ID, "phase": wf.Phase, "step": wf.StepIndex, "use": st.String(), "attempt": wf.StepAttempt, "result": "fallback"}); err != nil {
		return err
	}
	return r.nextStep(wf)
}

// checkLost sends the query that settles a lost command (workflow.LostCheck) as the step's
// current command, within the step's deadline: the lost command itself is never sent again.
func (r *run) checkLost(wf *store.Workflow, st workflow.Step, lost store.Command, check workflow.LostCheck) error {
	how := "its agent went away after acknowledging it"
	if lost.Error == store.RestoreFenceError {
		how = "the store was restored from a backup, and an agent may have run it since"
	}
	why := fmt.Sprintf("%s lost: %s; querying %s before deciding", lost.Kind, how, check.Query)
	q, err := r.buildCommand(wf, workflow.Step{Use: st.Use, Args: map[string]string{"query": check.Query}}, workflow.LostCheckCommand)
	if err != nil {
		return r.stepFailed(wf, st, provision.FaultStepFailed, fmt.Sprintf("%s lost, and its check cannot be sent: %v", lost.Kind, err), true)
	}
	if err := r.tx.InsertCommand(r.ctx, &q); err != nil {
		return err
	}
	r.keep(q)
	r.notify(q)
	wf.CurrentCommand = q.ID
	if err := r.event("workflow.step", r.n.State, r.n.State, why, map[string]any{"workflow": wf.ID, "phase": wf.Phase, "step": wf.StepIndex, "use": st.String(), "attempt": wf.StepAttempt, "command": lost.ID, "query": q.ID, "result": "lost"}); err != nil {
		return err
	}
	return r.saveWorkflow(wf)
}

// settleLost decides a step whose command was lost by the answer of its check (q, final): the
// effect is there, the step is done; otherwise, or when the query failed, the step is retried
// by its policy or fails.
func (r *run) settleLost(wf *store.Workflow, st workflow.Step, kind workflow.StepKind, q store.Command) error {
	check, _ := workflow.LostCheckFor(kind, st)
	if command.State(q.State) != command.Succeeded {
		return r.stepFailed(wf, st, provision.FaultStepFailed, fmt.Sprintf("%s was lost and the %s query to settle it %s: %s", kind.Command, check.Query, q.State, q.Error), true)
	}
	got, err := lostAnswer(q.Result, check.Query)
	if err != nil {
		return r.stepFailed(wf, st, provision.FaultStepFailed, fmt.Sprintf("%s was lost and the %s query to settle it answered %v", kind.Command, check.Query, err), true)
	}
	if check.Query == "power" {
		r.n.Power = got
		if err := r.tx.SetPower(r.ctx, r.n.ID, got); err != nil {
			return err
		}
	}
	if got != check.Want {
		return r.stepFailed(wf, st, provision.FaultStepFailed, fmt.Sprintf("%s was lost and did not take effect: %s is %s, not %s", kind.Command, check.Query, got, check.Want), true)
	}
	if err := r.event("workflow.step", r.n.State, r.n.State, fmt.Sprintf("%s was lost but took effect: %s is %s", kind.Command, check.Query, got),
		map[string]any{"workflow": wf.ID, "phase": wf.Phase, "step": wf.StepIndex, "use": st.String(), "command": q.ID, "result": "succeeded"}); err != nil {
		return err
	}
	return r.nextStep(wf)
}

// lostAnswer reads field from a query's result: a JSON object whose field is a non-empty string.
func lostAnswer(result, field string) (string, error) {
	var m map[string]any
	if err := json.Unmarshal([]byte(result), &m); err != nil {
		return "", fmt.Errorf("a result that is not a JSON object: %w", err)
	}
	v, _ := m[field].(string)
	if v == "" {
		return "", fmt.Errorf("a result without %q", field)
	}
	return v, nil
}

// stepSkipped moves past a step that has nothing to do, recording why.
func (r *run) stepSkipped(wf *store.Workflow, st workflow.Step, why string) error {
	r.addEvent("workflow.step", r.n.State, r.n.State, why, stepJSON(wf.ID, wf.Phase, wf.StepIndex, st.String(), false, "", "skipped"))
	return r.nextStep(wf)
}

func (r *run) stepDone(wf *store.Workflow, st workflow.Step, commandID string) error {
	// A self-terminating command (kexec) never reports: the step is done because what it
	// awaited happened. Close the command so no later agent of the node is offered it again.
	if commandID != "" {
		c, err := r.command(commandID)
		if err != nil {
			return err
		}
		if !command.State(c.State).Final() {
			c.State, c.FinishedAt = string(command.Succeeded), r.tx.At()
			c.Progress = `{"message":"completed: the awaited agent joined"}`
			if err := r.updateCommand(&c); err != nil {
				return err
			}
		}
	}
	r.addEvent("workflow.step", r.n.State, r.n.State, "", stepJSON(wf.ID, wf.Phase, wf.StepIndex, st.String(), true, commandID, "succeeded"))
	return r.nextStep(wf)
}

// nextStep moves the workflow to its next step, with nothing of the last one in flight.
func (r *run) nextStep(wf *store.Workflow) error {
	wf.StepIndex++
	wf.StepAttempt, wf.StepStartedAt, wf.StepDeadline, wf.CurrentCommand = 0, 0, 0, ""
	return r.saveWorkflow(wf)
}

// stepFailed retries the step while its policy allows (retryable failures only), else fails
// the workflow (steps) or records the failure and goes on (cleanup).
func (r *run) stepFailed(wf *store.Workflow, st workflow.Step, fault provision.Fault, msg string, retryable bool) error {
	return r.stepFailedFrom(wf, st, fault, msg, retryable, st.RetryFrom)
}

// rebootFrom is where a ramdisk step whose ramdisk went away starts again: the first step of
// metal.ensureRamdisk that a ramdisk boot needs (a new boot entry, a new one-time token).
const rebootFrom = "boot.prepareRamdisk"

// ramdiskLost ends a step whose command's ramdisk went away (crashed, or its host hung): no
// ramdisk takes a retry as it is, so a step with retries left starts again from the workflow's
// boot.prepareRamdisk (a new boot entry, the power cycle, a new ramdisk), its tries counted by
// the commands it sent. A step without retries, or in a workflow that boots no ramdisk of its
// own, fails.
func (r *run) ramdiskLost(wf *store.Workflow, st workflow.Step, msg string) error {
	from := ""
	if st.Retries > 0 {
		steps, err := r.e.stepsOf(wf)
		if err != nil {
			return err
		}
		for i := wf.StepIndex - 1; i >= 0 && from == ""; i-- {
			if steps[i].Use == rebootFrom {
				from = rebootFrom
			}
		}
	}
	return r.stepFailedFrom(wf, st, provision.FaultStepFailed, msg, from != "", from)
}

// stepFailedFrom is stepFailed with the step's retry starting again at the last earlier step
// of use from ("": the step itself).
func (r *run) stepFailedFrom(wf *store.Workflow, st workflow.Step, fault provision.Fault, msg string, retryable bool, from string) error {
	if err := r.event("workflow.step", r.n.State, r.n.State, msg, map[string]any{"workflow": wf.ID, "phase": wf.Phase, "step": wf.StepIndex, "use": st.String(), "attempt": wf.StepAttempt, "result": "failed"}); err != nil {
		return err
	}
	if retryable && from != "" && fault != provision.FaultWorkflowTimeout {
		again, err := r.retryFrom(wf, st, from)
		if err != nil || again {
			return err
		}
	} else if retryable && wf.StepAttempt <= st.Retries && fault != provision.FaultWorkflowTimeout {
		wf.StepStartedAt, wf.StepDeadline, wf.CurrentCommand = 0, 0, ""
		return r.saveWorkflow(wf)
	}
	if wf.FaultCode == "" {
		wf.FaultCode, wf.Error = string(fault), msg
	}
	if wf.Phase == "steps" {
		r.toCleanup(wf)
		return r.saveWorkflow(wf)
	}
	return r.nextStep(wf)
}

// retryFrom retries a step from the last earlier step of use from (workflow.Step.RetryFrom, or
// rebootFrom), while the step has sent no more commands than its retries allow; false when they
// are spent (the step fails).
func (r *run) retryFrom(wf *store.Workflow, st workflow.Step, from string) (bool, error) {
	kind, err := workflow.LookupStep(st.Use)
	if err != nil {
		return false, err
	}
	sent, err := r.tx.CommandsOfWorkflow(r.ctx, wf, kind.Command)
	if err != nil {
		return false, err
	}
	tries := 0
	for _, c := range sent {
		if c.StepIndex == wf.StepIndex {
			tries++
		}
	}
	if tries > st.Retries {
		return false, nil
	}
	steps, err := r.e.stepsOf(wf)
	if err != nil {
		return false, err
	}
	for i := wf.StepIndex - 1; i >= 0; i-- {
		if steps[i].Use != from {
			continue
		}
		if err := r.event("workflow.step", r.n.State, r.n.State, fmt.Sprintf("retrying %s from %s (attempt %d of %d)", st, steps[i], tries+1, st.Retries+1),
			map[string]any{"workflow": wf.ID, "phase": wf.Phase, "step": wf.StepIndex, "use": st.String(), "retryFrom": i, "result": "retry"}); err != nil {
			return false, err
		}
		wf.StepIndex = i
		wf.StepAttempt, wf.StepStartedAt, wf.StepDeadline, wf.CurrentCommand = 0, 0, 0, ""
		return true, r.saveWorkflow(wf)
	}
	return false, fmt.Errorf("step %s of workflow %s retries from %s, which does not come before it", st, wf.ID, from)
}

func (r *run) finish(wf *store.Workflow) error {
	switch {
	case wf.AbortRequested:
		wf.State = wfAborted
	case wf.FaultCode != "":
		wf.State = wfFailed
	default:
		wf.State = wfSucceeded
	}
	wf.FinishedAt = r.tx.At()
	if err := r.saveWorkflow(wf); err != nil {
		return err
	}
	r.finished = append(r.finished, *wf)
	return r.event("workflow."+wf.State, r.n.State, r.n.State, wf.Error, map[string]any{"workflow": wf.ID, "profile": wf.Profile, "fault": wf.FaultCode})
}

// applyOutcome moves the node by its finished workflow: complete → next state of the chain,
// fail → failed. An aborted workflow's node is already failed.
func (r *run) applyOutcome(wf *store.Workflow) error {
	wf.OutcomeApplied = true
	if err := r.saveWorkflow(wf); err != nil {
		return err
	}
	n := &r.n
	if wf.State == wfAborted || wf.NodeState != n.State || !provisionNode(*n).Busy() {
		return nil
	}
	if wf.State == wfFailed {
		return r.failNode(provision.Fault(wf.FaultCode), wf.Error)
	}
	if n.State == string(provision.Releasing) {
		if err := r.verifiedWipe(wf); err != nil {
			return r.failNode(provision.FaultUnverifiedWipe, err.Error())
		}
	}
	next, target, err := provision.Complete(provision.State(n.State), provision.State(n.TargetState), provision.Verb(n.ChainVerb))
	if err != nil {
		return r.failNode(provision.FaultStepFailed, err.Error())
	}
	from := n.State
	n.State, n.TargetState = string(next), string(target)
	if target == "" {
		n.ChainVerb = ""
	}
	if err := r.tx.UpdateNode(r.ctx, n); err != nil {
		return err
	}
	data := map[string]any{"workflow": wf.ID, "profile": wf.Profile}
	if releasesUserData(next) && n.UserDataRef != "" {
		// The node is released: its deploy's user-data (and the sealed secret) goes.
		if err := r.tx.SetNodeUserData(r.ctx, n, store.UserData{}); err != nil {
			return err
		}
		data["userDataDeleted"] = true
	}
	return r.event("node.complete", from, n.State, "", data)
}

// releasesUserData reports whether a node that comes to rest in state s has been released:
// its operator user-data is deleted there. Pure.
func releasesUserData(s provision.State) bool {
	return s == provision.Ready || s == provision.Retired
}

func (r *run) failNode(fault provision.Fault, msg string) error {
	n := &r.n
	m := provision.Fail(provisionNode(*n), fault)
	from := n.State
	n.State, n.TargetState, n.FailedFrom = string(m.To), string(m.Target), string(m.FailedFrom)
	n.FaultCode, n.FaultMsg = string(fault), truncate(msg, 1000)
	n.Maintenance, n.MaintenanceReason = true, string(fault)
	if err := r.tx.UpdateNode(r.ctx, n); err != nil {
		return err
	}
	return r.event("node.fail", from, n.State, msg, map[string]any{"fault": string(fault)})
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// controlPlane runs a step that sends nothing.
func (r *run) controlPlane(st workflow.Step) error {
	switch st.Use {
	case "metal.revokeIdentity":
		r.n.IdentityGeneration++
		if err := r.tx.UpdateNode(r.ctx, &r.n); err != nil {
			return err
		}
		return r.event("node.identity.revoked", r.n.State, r.n.State, "", map[string]any{"generation": r.n.IdentityGeneration})
	case "metal.linger":
		return r.startLinger()
	}
	return fmt.Errorf("step %s has no control-plane implementation", st.Use)
}

// stepsOf returns the steps of the workflow's current phase (its steps, or its cleanup).
func (e *Engine) stepsOf(wf *store.Workflow) ([]workflow.Step, error) {
	src := wf.Steps
	if wf.Phase == "cleanup" {
		src = wf.Cleanup
	}
	steps, err := e.decodeSteps(src)
	if err != nil {
		return nil, fmt.Errorf("decoding steps of workflow %s: %w", wf.ID, err)
	}
	return steps, nil
}

// decodeSteps decodes a workflow's step list, once per distinct JSON (e.steps).
func (e *Engine) decodeSteps(src string) ([]workflow.Step, error) {
	if steps, ok := e.steps.Get(src); ok {
		return steps, nil
	}
	var steps []workflow.Step
	if err := json.Unmarshal([]byte(src), &steps); err != nil {
		return nil, err
	}
	e.steps.Put(src, steps)
	return steps, nil
}
