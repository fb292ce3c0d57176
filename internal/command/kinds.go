// Package command holds the command kinds of DESIGN §5 as data: where each runs and what it is
// (destructive, attested, reroutable, self-terminating), and the life of a command.
package command

import (
	"fmt"
	"slices"
)

// Target is where a command runs.
type Target string

const (
	OnSite    Target = "site"    // a site agent of the node's site
	OnRamdisk Target = "ramdisk" // the node's own ramdisk agent
)

// Kind describes one command kind.
type Kind struct {
	Name   string
	RunsOn Target
	// Destructive commands are sent only under an approved batch where approvals are required.
	Destructive bool
	// Attested results are signed by the node key; the store verifies them.
	Attested bool
	// Reroutable: a command no agent acknowledged moves to another agent of the site when its
	// agent goes away. Every site kind is: an agent runs a command only once the control plane
	// recorded its acknowledgement (agentlink), so one never acknowledged never ran. A ramdisk's
	// command has no other agent to go to.
	Reroutable bool
	// BootLeaseHolder: sent to the site agent holding the boot lease first.
	BootLeaseHolder bool
	// SelfTerminating: success is observed elsewhere (the installed OS rejoins), not reported.
	SelfTerminating bool
	// BMCCredentials: the command acts on the node's BMC and carries its credentials, encrypted
	// to the agent that claims it (the row names only their secret references).
	BMCCredentials bool
}

var kinds = []Kind{
	{Name: "bmc.query", RunsOn: OnSite, Reroutable: true, BMCCredentials: true},
	{Name: "bmc.boot", RunsOn: OnSite, Destructive: true, Reroutable: true, BMCCredentials: true},
	{Name: "bmc.power", RunsOn: OnSite, Destructive: true, Reroutable: true, BMCCredentials: true},
	{Name: "bmc.rotate", RunsOn: OnSite, Destructive: true, Reroutable: true, BMCCredentials: true},
	// bmc.bios writes the pool's BIOS settings that differ as pending settings, applied at the
	// next reset. Destructive: it changes the machine's configuration.
	{Name: "bmc.bios", RunsOn: OnSite, Destructive: true, Reroutable: true, BMCCredentials: true},
	// bmc.firmware has the BMC install the pool's firmware images where a component runs
	// another version than the baseline's (applied at the next reset). Destructive: it changes
	// what the machine runs.
	{Name: "bmc.firmware", RunsOn: OnSite, Destructive: true, Reroutable: true, BMCCredentials: true},
	// bmc.console relays an operator's serial-console session (IPMI Serial-over-LAN) until the
	// operator closes it or its deadline passes. Not destructive in the approval sense (it
	// changes nothing by itself, and a console wanted for a machine that fails cannot wait for a
	// quorum): the operator role opens it, and every session is an event naming who did.
	{Name: "bmc.console", RunsOn: OnSite, Reroutable: true, BMCCredentials: true},
	// bmc.media inserts or ejects an ISO: the BMC's virtual media, else an iPXE sanboot entry
	// of the ISO pinned in the site cache (hence the boot-lease holder).
	{Name: "bmc.media", RunsOn: OnSite, Destructive: true, Reroutable: true, BootLeaseHolder: true, BMCCredentials: true},
	{Name: "boot.prepareRamdisk", RunsOn: OnSite, Reroutable: true, BootLeaseHolder: true},
	{Name: "boot.prepareInstance", RunsOn: OnSite, Reroutable: true, BootLeaseHolder: true},
	{Name: "boot.cleanUp", RunsOn: OnSite, Reroutable: true, BootLeaseHolder: true},
	{Name: "site.httpProxy", RunsOn: OnSite, Destructive: true, Reroutable: true},
	{Name: "inventory.refresh", RunsOn: OnRamdisk},
	// bmc.provisionInband makes the node's BMC credential from the host, over its IPMI system
	// interface (the acceptance flow's in-band enrollment); the password arrives encrypted to
	// the ramdisk's node certificate. Destructive: it changes the BMC's users.
	{Name: "bmc.provisionInband", RunsOn: OnRamdisk, Destructive: true, BMCCredentials: true},
	{Name: "diag.dcgm", RunsOn: OnRamdisk, Attested: true},
	{Name: "disk.wipe", RunsOn: OnRamdisk, Destructive: true, Attested: true},
	{Name: "deploy.image", RunsOn: OnRamdisk, Destructive: true},
	// deploy.configDrive adds a config drive (a FAT partition after the image's last one)
	// holding the node's meta-data, user-data and vendor-data as the site serves them:
	// cloud-init's NoCloud layout (labelled CIDATA), or OpenStack's (config-2, openstack/latest/).
	// Destructive: it changes the disk's partition table.
	{Name: "deploy.configDrive", RunsOn: OnRamdisk, Destructive: true},
	{Name: "boot.kexec", RunsOn: OnRamdisk, Destructive: true, SelfTerminating: true},
	// ramdisk.powerOff ends a lingering ramdisk's fast-track window: the ramdisk powers its own
	// host off. Sent only while no workflow holds the node, to an idle ramdisk whose workflow
	// (with its power.off in scope) completed: nothing of the machine's is lost, hence not
	// destructive. It reports success just before the host goes down.
	{Name: "ramdisk.powerOff", RunsOn: OnRamdisk},
}

// Kinds lists every kind.
func Kinds() []Kind { return slices.Clone(kinds) }

// Lookup returns the kind named name.
func Lookup(name string) (Kind, error) {
	for _, k := range kinds {
		if k.Name == name {
			return k, nil
		}
	}
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = k.Name
	}
	return Kind{}, fmt.Errorf("unknown command kind %q: known are %v", name, names)
}

// State is a command's life: queued → delivered (acknowledged) → running → succeeded | failed | lost.
type State string

const (
	Queued    State = "queued"
	Delivered State = "delivered"
	Running   State = "running"
	Succeeded State = "succeeded"
	Failed    State = "failed"
	Lost      State = "lost"
)

// Final reports whether a command state is an end.
func (s State) Final() bool { return s == Succeeded || s == Failed || s == Lost }

// transitions: which reported state may follow which. Reports are idempotent (same state again
// is accepted and ignored) and never go backwards.
var transitions = map[State][]State{
	Queued:    {Delivered, Running, Succeeded, Failed, Lost},
	Delivered: {Running, Succeeded, Failed, Lost},
	Running:   {Succeeded, Failed, Lost},
}

// CanMove reports whether a command in from may move to to.
func CanMove(from, to State) bool { return slices.Contains(transitions[from], to) }

// AgentGone is what happens to a command whose agent went away: one the agent never acknowledged
// is released for another agent when its kind is reroutable (or stays for the same agent, e.g.
// a node's ramdisk); one it acknowledged is lost (never sent twice), unless its kind is
// self-terminating: its agent going away is how it runs (a kexec ends the ramdisk), and it
// stays as it is until its step settles it, succeeded when the awaited agent joins (an
// installed OS can take minutes, longer than the agents' grace period), failed at the step's
// deadline.
func AgentGone(s State, k Kind) (next State, release bool) {
	switch s {
	case Queued:
		return Queued, k.Reroutable
	case Delivered, Running:
		if k.SelfTerminating {
			return s, false
		}
		return Lost, false
	}
	return s, false
}
