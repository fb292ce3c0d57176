package engine

import (
	"fmt"
	"time"

	"bcd/internal/command"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// The fast-track window (seed 003 phase 0.9, docs/architecture.md "Fast-track window"): a
// workflow that leaves the node resting with its ramdisk up (commissioning and release with a
// window, inspection always) ends with metal.linger, which records until when the ramdisk
// lingers. A workflow started before then finds the ramdisk up and skips metal.ensureRamdisk
// (FastTrackable). When the window passes with no workflow holding the node, the reconciler
// sends the ramdisk ramdisk.powerOff and the ramdisk powers its own host off: both decisions are
// taken in the node's reconcile transaction, from its rows, so a workflow that starts at the
// window's last second either comes first (the linger ends, no power-off is sent) or finds the
// power-off command: withdrawn if no agent was offered it yet (the ramdisk stays usable), else
// counted as a boot command, so the workflow boots the node again instead of using a ramdisk
// that is going down.

// LingerAction is what the reconciler does about a node's lingering ramdisk.
type LingerAction int

const (
	// LingerNothing: no ramdisk lingers, or a workflow holds the node (it ends the linger).
	LingerNothing LingerAction = iota
	// LingerWait: the window is open, or the power-off command is out: look again later.
	LingerWait
	// LingerPowerOff: the window passed with no workflow: tell the ramdisk to power off.
	LingerPowerOff
	// LingerForget: the node is off already, or its ramdisk is gone (not connected, or the node
	// was booted since): nothing is left to tell.
	LingerForget
	// LingerAbandon: the power-off is still unacknowledged and its ramdisk is gone: withdraw it
	// (a later boot of the node must never be handed it) and forget the window.
	LingerAbandon
	// LingerPoweredOff: the ramdisk reported the power-off, or left once it had it.
	LingerPoweredOff
	// LingerRefused: the ramdisk failed the power-off (it stays up until the next workflow
	// boots the node, or an operator powers it off).
	LingerRefused
)

func (a LingerAction) String() string {
	return [...]string{"nothing", "wait", "powerOff", "forget", "abandon", "poweredOff", "refused"}[a]
}

// LingerFacts are the rows a linger decision reads.
type LingerFacts struct {
	Until, Now int64 // the node's linger deadline (0: none) and the transaction's time, µs
	// Held: a workflow holds the node (an open workflow, or a chain waiting to start one).
	Held  bool
	Power string // the node's power axis: on, off, or "" unknown
	// RamdiskUp: the ramdisk to tell is there: before the power-off is sent or claimed, the
	// node's ramdisk is connected and joined after its last boot command (FastTrackable); once
	// an agent claimed it, that agent is connected. Read only once the window passed.
	RamdiskUp bool
	// Command is the power-off command's state, "" before it is sent.
	Command command.State
}

// Linger decides what happens to a lingering ramdisk. Pure.
func Linger(f LingerFacts) LingerAction {
	switch {
	case f.Held:
		return LingerNothing // never powered off while a workflow may use it
	case f.Command != "":
		switch f.Command {
		case command.Succeeded, command.Lost:
			return LingerPoweredOff
		case command.Failed:
			return LingerRefused
		case command.Queued:
			if !f.RamdiskUp {
				return LingerAbandon
			}
		}
		return LingerWait
	case f.Until == 0:
		return LingerNothing
	case f.Now < f.Until:
		return LingerWait
	case f.Power == "off", !f.RamdiskUp:
		return LingerForget
	}
	return LingerPowerOff
}

// nodePool is the node's pool, read once per run (its fast-track window and firmware baseline
// are both asked for in one run: a firmware check's result, then the power-off's condition);
// ok false: the node has none.
func (r *run) nodePool() (p store.Pool, ok bool, err error) {
	if r.n.PoolID == "" {
		return store.Pool{}, false, nil
	}
	if r.pool == nil {
		p, err := r.tx.Pool(r.ctx, r.n.PoolID)
		if err != nil {
			return store.Pool{}, false, fmt.Errorf("reading the pool of node %s: %w", r.n.ID, err)
		}
		r.pool = &p
	}
	return *r.pool, true, nil
}

// fastTrackWindow is the node's window: its pool's policy, else the server's default.
func (r *run) fastTrackWindow() (time.Duration, error) {
	p, ok, err := r.nodePool()
	if err != nil || !ok {
		return r.e.cfg.FastTrackWindow, err
	}
	w, err := workflow.ParseFastTrackWindow(p.Policy.FastTrackWindow, r.e.cfg.FastTrackWindow)
	if err != nil {
		return 0, fmt.Errorf("pool of node %s: %w", r.n.ID, err)
	}
	return w, nil
}

// facts are what a conditional step is decided on.
func (r *run) facts(wf *store.Workflow, c workflow.Condition) (workflow.Facts, error) {
	f := workflow.Facts{MACs: len(r.n.MACs)}
	if c == workflow.WhenNotRejoined {
		since, err := r.tx.NodeAgentConnectedSince(r.ctx, r.n.ID, "os", r.n.IdentityGeneration)
		f.Rejoined = since > 0 && since >= wf.BootEpoch
		return f, err
	}
	if c == workflow.WhenFirmwareBaseline || c == workflow.WhenFirmwareImages || c == workflow.WhenBaselineNoImages {
		p, _, err := r.nodePool()
		f.Baseline, f.FirmwareImages = len(p.Policy.FirmwareBaseline) > 0, len(p.Policy.FirmwareImages) > 0
		return f, err
	}
	if c == workflow.WhenBIOSSettings {
		settings, err := r.biosSettings()
		f.BIOS = len(settings) > 0
		return f, err
	}
	if c == workflow.WhenFastTrack || c == workflow.WhenNoFastTrack {
		var err error
		f.FastTrackWindow, err = r.fastTrackWindow()
		return f, err
	}
	return f, nil
}

// startLinger is metal.linger: the ramdisk lingers for the node's window. Where the chain goes
// on into another workflow (inspection in the enroll chain) that workflow takes the ramdisk at
// once: nothing to record.
func (r *run) startLinger() error {
	if _, target, err := provision.Complete(provision.State(r.n.State), provision.State(r.n.TargetState), provision.Verb(r.n.ChainVerb)); err == nil && target != "" {
		return nil
	}
	w, err := r.fastTrackWindow()
	if err != nil {
		return err
	}
	n := &r.n
	n.LingerUntil, n.LingerCommand = r.tx.At()+w.Microseconds(), ""
	if n.LingerUntil == 0 {
		n.LingerUntil = 1 // a window of 0 at time 0 (tests): still lingering, ending at once
	}
	if err := r.tx.UpdateNode(r.ctx, n); err != nil {
		return err
	}
	return r.event("node.ramdisk.linger", n.State, n.State, LingerReason(n.LingerUntil), map[string]any{"until": store.Micros(n.LingerUntil).Format(time.RFC3339), "window": w.String()})
}

// LingerReason is how a lingering ramdisk is shown (events, the node's activity).
func LingerReason(until int64) string {
	return "ramdisk lingering until " + store.Micros(until).Format(time.RFC3339) + " (fast track)"
}

// linger applies Linger to a resting node whose ramdisk lingers.
func (r *run) linger(held bool) (time.Duration, bool, error) {
	n := &r.n
	f := LingerFacts{Until: n.LingerUntil, Now: r.tx.At(), Held: held, Power: n.Power}
	var c store.Command
	if n.LingerCommand != "" {
		var err error
		if c, err = r.tx.Command(r.ctx, n.LingerCommand); err != nil {
			return 0, false, err
		}
		f.Command = command.State(c.State)
	}
	var err error
	switch {
	case f.Command == command.Queued && c.TargetAgent != "":
		f.RamdiskUp, err = r.tx.AgentConnected(r.ctx, c.TargetAgent)
	case f.Command == command.Queued, f.Command == "" && f.Until != 0 && f.Now >= f.Until && !held:
		f.RamdiskUp, err = r.ramdiskUp()
	}
	if err != nil {
		return 0, false, err
	}
	switch a := Linger(f); a {
	case LingerNothing:
		return 0, false, nil
	case LingerWait:
		if f.Command == "" {
			return time.Duration(f.Until-f.Now) * time.Microsecond, false, nil
		}
		// Woken when the command reports or its agent leaves; looked at again meanwhile, since
		// the departure of a ramdisk that never took the command wakes nothing.
		return lingerRecheck, false, nil
	case LingerPowerOff:
		c := store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: "ramdisk.powerOff", Subject: n.ID, Args: "{}",
			RunsOn: string(command.OnRamdisk), Generation: n.IdentityGeneration}
		if err := r.tx.InsertCommand(r.ctx, &c); err != nil {
			return 0, false, err
		}
		r.notify(c)
		n.LingerCommand = c.ID
		if err := r.tx.UpdateNode(r.ctx, n); err != nil {
			return 0, false, err
		}
		return 0, true, r.event("node.ramdisk.powerOff", n.State, n.State, "fast-track window passed with no workflow: the ramdisk powers its host off",
			map[string]any{"command": c.ID, "until": store.Micros(f.Until).Format(time.RFC3339)})
	case LingerAbandon:
		closed, _, err := r.tx.WithdrawCommand(r.ctx, n.LingerCommand, "withdrawn: the ramdisk left before acknowledging it")
		if err != nil || !closed {
			return lingerRecheck, false, err // acknowledged meanwhile: its outcome decides
		}
		fallthrough
	default:
		why, data := "", map[string]any{"command": n.LingerCommand}
		switch a {
		case LingerForget:
			why = "fast-track window passed; the node is already off"
			if f.Power != "off" {
				why = "fast-track window passed; the ramdisk is gone (not connected, or the node was booted since): not powered off (the power poll shows the node's power)"
			}
		case LingerAbandon:
			why = "the ramdisk left before acknowledging its power-off (withdrawn): not known to be off (the power poll shows the node's power)"
		case LingerPoweredOff:
			why = "the ramdisk powered its host off"
			if f.Command == command.Lost {
				why = "the ramdisk left after taking the power-off: taken as off (the power poll confirms)"
			}
			n.Power = "off"
		case LingerRefused:
			why = "the ramdisk did not power off: " + c.Error
		}
		n.LingerUntil, n.LingerCommand = 0, ""
		if err := r.tx.UpdateNode(r.ctx, n); err != nil {
			return 0, false, err
		}
		return 0, true, r.event("node.ramdisk.linger.end", n.State, n.State, why, data)
	}
}

// lingerRecheck is how often a node whose ramdisk was told to power off is looked at while the
// command is out.
const lingerRecheck = 30 * time.Second

// endLinger is called as a workflow starts: the workflow takes over the node, and with it a
// lingering ramdisk (the fast-track decision follows, at metal.ensureRamdisk). A power-off no
// agent acknowledged is withdrawn so that no later boot of the node is ever offered it (node
// agents keep their id across boots); if no agent had claimed it, the ramdisk never saw it and
// stays usable. One an agent claimed counts as a boot command (the ramdisk may be going down),
// so the workflow boots the node again.
func (r *run) endLinger(profile string) error {
	n := &r.n
	if n.LingerUntil == 0 && n.LingerCommand == "" {
		return nil
	}
	data := map[string]any{"profile": profile}
	why := "workflow " + profile + " takes the lingering ramdisk"
	if n.LingerCommand != "" {
		data["command"] = n.LingerCommand
		closed, offered, err := r.tx.WithdrawCommand(r.ctx, n.LingerCommand, "withdrawn: workflow "+profile+" started")
		if err != nil {
			return err
		}
		if !closed || offered {
			why = "workflow " + profile + " started after the ramdisk was told to power off"
		}
	}
	n.LingerUntil, n.LingerCommand = 0, ""
	if err := r.tx.UpdateNode(r.ctx, n); err != nil {
		return err
	}
	return r.event("node.ramdisk.linger.end", n.State, n.State, why, data)
}
