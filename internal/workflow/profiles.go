// Package workflow holds the workflow profiles of DESIGN §4/§5 as data: named lists of steps with
// arguments, cleanup steps, and the step kinds (what each step sends, where, with which timeout
// and retry policy). The engine runs them; nothing here does I/O.
package workflow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/command"
)

// Step is one step of a profile: `disk.wipe{mode: quick}`.
type Step struct {
	Use  string            `json:"use"`
	Args map[string]string `json:"args,omitempty"`
	// On routes the step explicitly ("site" or "ramdisk"); empty takes the step kind's default.
	On string `json:"on,omitempty"`
	// Timeout and Retries override the step kind's.
	Timeout time.Duration `json:"timeout,omitempty"`
	Retries int           `json:"retries,omitempty"`
	// FastTrack marks the parts of metal.ensureRamdisk: the engine skips them while the node's
	// ramdisk is up (connected under the current identity, power on), saving a reboot. Set by
	// Resolve only; profiles cannot set it.
	FastTrack bool `json:"fastTrack,omitempty"`
	// When makes the step conditional: it runs only when the condition holds when the step
	// starts, else it is skipped (see Condition). Set by composite steps; empty: always.
	When Condition `json:"when,omitempty"`
	// RetryFrom makes a retry of the step start again at the last earlier step of that use,
	// within the step's retries (counted by the commands it sent). A power cycle into a
	// ramdisk is retried from boot.prepareRamdisk: the boot entry's one-time token may have
	// been used by a boot that happened (a lost cycle), and the next boot needs a new one. Set
	// by composite steps only.
	RetryFrom string `json:"retryFrom,omitempty"`
}

// Condition is when a conditional step runs.
type Condition string

const (
	Always Condition = ""
	// WhenNoMACs: the node has no known MAC (enrolled by product UUID only, as IPMI nodes are):
	// the steps that power-cycle it into PXE to learn its MAC (DESIGN §6 Discovery).
	WhenNoMACs Condition = "noMacs"
	// WhenFastTrack: the node's fast-track window is open (not 0): the ramdisk lingers after
	// the workflow (metal.linger) instead of the BMC powering the node off.
	WhenFastTrack Condition = "fastTrack"
	// WhenNoFastTrack: the window is 0: the node is powered off at once (power.off).
	WhenNoFastTrack Condition = "noFastTrack"
	// WhenNotRejoined: the installed OS has not joined since the workflow's last boot command
	// (the kexec failed or its kernel never came up): boot.kexec's fallback reboots through the
	// BMC into the disk.
	WhenNotRejoined Condition = "notRejoined"
	// WhenFirmwareBaseline: the node's pool names a firmware baseline: firmware.check runs.
	WhenFirmwareBaseline Condition = "firmwareBaseline"
	// WhenBIOSSettings: the node's pool names BIOS settings: bios.apply and bios.verify run.
	WhenBIOSSettings Condition = "biosSettings"
	// WhenFirmwareImages: the node's pool names firmware images: firmware.update runs before
	// the ramdisk's boot, and commissioning checks the baseline after that boot.
	WhenFirmwareImages Condition = "firmwareImages"
	// WhenBaselineNoImages: a baseline and no firmware images: commissioning checks the
	// baseline first (no boot spent on a machine that drifted and that nothing will update).
	WhenBaselineNoImages Condition = "firmwareBaselineNoImages"
)

// Facts are what conditions are decided on, read as the step starts.
type Facts struct {
	MACs            int           // the node's known MACs
	FastTrackWindow time.Duration // the node's pool's fast-track window (0: off)
	Rejoined        bool          // the installed OS joined since the workflow's last boot command
	Baseline        bool          // the node's pool names a firmware baseline
	BIOS            bool          // the node's pool names BIOS settings
	FirmwareImages  bool          // the node's pool names firmware images
}

// Holds reports whether a step with condition c runs for a node with facts f. Pure.
func (c Condition) Holds(f Facts) bool {
	switch c {
	case WhenNoMACs:
		return f.MACs == 0
	case WhenFastTrack:
		return f.FastTrackWindow > 0
	case WhenNoFastTrack:
		return f.FastTrackWindow <= 0
	case WhenNotRejoined:
		return !f.Rejoined
	case WhenFirmwareBaseline:
		return f.Baseline
	case WhenBIOSSettings:
		return f.BIOS
	case WhenFirmwareImages:
		return f.FirmwareImages
	case WhenBaselineNoImages:
		return f.Baseline && !f.FirmwareImages
	case WhenOverridden:
		return false
	}
	return true
}

// ParseFastTrackWindow reads a pool policy's fastTrackWindow: a Go duration from 0 (off) to 24h;
// empty is def (the server's default).
func ParseFastTrackWindow(s string, def time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 || d > MaxFastTrackWindow {
		return 0, fmt.Errorf("fast-track window %q: use a duration from 0s (off) to %s, e.g. 10m", s, MaxFastTrackWindow)
	}
	return d, nil
}

// MaxFastTrackWindow bounds the fast-track window: a ramdisk is not a place to keep machines.
const MaxFastTrackWindow = 24 * time.Hour

func (s Step) String() string {
	use := s.Use
	if s.When != Always {
		use += "?" + string(s.When)
	}
	if len(s.Args) == 0 {
		return use
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(s.Args)) {
		parts = append(parts, k+": "+s.Args[k])
	}
	return use + "{" + strings.Join(parts, ", ") + "}"
}

// Profile is a named workflow.
type Profile struct {
	Name    string `json:"name"`
	Steps   []Step `json:"steps"`
	Cleanup []Step `json:"cleanup,omitempty"`
	// Sends lists extra command kinds plugin steps relay (declared, else refused).
	Sends []string `json:"sends,omitempty"`
}

// Await is what a step waits for when it sends nothing, or besides what it sends.
type Await string

const (
	AwaitNone    Await = ""
	AwaitRamdisk Await = "ramdisk" // the node's ramdisk joined (current identity generation)
	AwaitRejoin  Await = "rejoin"  // the installed OS rejoined as the node
	// AwaitMAC: a MAC-less node's MAC was learned from what it PXE-booted with (bound at once
	// on a trusted provisioning network, else once an operator confirmed the candidate).
	AwaitMAC Await = "mac"
)

// StepKind is what a step does.
type StepKind struct {
	Use string
	// Command is the command kind the step sends; empty for control-plane and await steps.
	Command string
	// Args are fixed command arguments the step adds (e.g. bmc.power{action: off}).
	Args map[string]string
	// Await, for steps that wait for an agent rather than (or after) a result.
	Await Await
	// ControlPlane steps run inside the engine (e.g. metal.revokeIdentity).
	ControlPlane bool
	// Relays marks a plugin step that relays commands on behalf of a plugin: its command kind
	// counts only when the profile declares it in sends (else the step is refused and the
	// command falls outside the destructive batch).
	Relays bool
	// FallBack: when the step's command fails or its time runs out, the workflow goes on to the
	// next step (its fallback, conditional on what the step was for) instead of failing.
	FallBack bool
	Timeout  time.Duration
	Retries  int
	// Expand replaces a composite step by its parts.
	Expand []Step
}

var stepKinds = []StepKind{
	{Use: "power.getPower", Command: "bmc.query", Args: map[string]string{"query": "power"}, Timeout: time.Minute, Retries: 3},
	{Use: "inspect.oob", Command: "bmc.query", Args: map[string]string{"query": "inventory"}, Timeout: 2 * time.Minute, Retries: 3},
	// firmware.check reads the firmware versions the BMC reports and compares them with the
	// pool's baseline (the engine: a difference fails the node with FIRMWARE_DRIFT). A BMC that
	// answers nothing is retried; one that answers other versions is not.
	{Use: "firmware.check", Command: "bmc.query", Args: map[string]string{"query": "firmware"}, Timeout: 5 * time.Minute, Retries: 3},
	// bios.apply writes the pool's BIOS settings that differ as pending settings (bmc.bios);
	// the reset that boots the ramdisk next applies them (a written setting makes a lingering
	// ramdisk unusable: the node is booted anew). bios.verify reads them back after that boot
	// (the engine: a difference fails the node with BIOS_DRIFT).
	{Use: "bios.apply", Command: "bmc.bios", Timeout: 10 * time.Minute, Retries: 2},
	{Use: "bios.verify", Command: "bmc.query", Args: map[string]string{"query": "bios"}, Timeout: 5 * time.Minute, Retries: 3},
	// firmware.update has the BMC install the pool's firmware images on the components that run
	// another version than the baseline's (bmc.firmware: the site agent caches each image and
	// serves it to the BMC); the next reset applies them, and firmware.check follows that boot.
	{Use: "firmware.update", Command: "bmc.firmware", Timeout: 2 * time.Hour, Retries: 1},
	{Use: "power.setPower", Command: "bmc.power", Timeout: 3 * time.Minute, Retries: 1},
	{Use: "power.off", Command: "bmc.power", Args: map[string]string{"action": "off"}, Timeout: 3 * time.Minute, Retries: 1},
	{Use: "power.cycle", Command: "bmc.power", Args: map[string]string{"action": "cycle"}, Timeout: 3 * time.Minute, Retries: 1},
	{Use: "management.setBootDevice", Command: "bmc.boot", Timeout: 2 * time.Minute, Retries: 3},
	// media.insert{image: NAME} attaches a catalog ISO (virtual media, else iPXE sanboot from
	// the site cache; setBootDevice{device: cd} then boots it); media.eject removes it.
	{Use: "media.insert", Command: "bmc.media", Args: map[string]string{"action": "insert"}, Timeout: 30 * time.Minute, Retries: 1},
	{Use: "media.eject", Command: "bmc.media", Args: map[string]string{"action": "eject"}, Timeout: 5 * time.Minute, Retries: 2},
	{Use: "boot.prepareRamdisk", Command: "boot.prepareRamdisk", Timeout: 5 * time.Minute, Retries: 3},
	{Use: "boot.prepareInstance", Command: "boot.prepareInstance", Timeout: 5 * time.Minute, Retries: 3},
	{Use: "boot.cleanUp", Command: "boot.cleanUp", Timeout: 2 * time.Minute, Retries: 3},
	{Use: "await.ramdisk", Await: AwaitRamdisk, Timeout: 15 * time.Minute},
	// await.macCandidate's timeout bounds the wait for the operator's confirmation; the window
	// in which the MAC must be seen after the power cycle is the engine's (10 minutes).
	{Use: "await.macCandidate", Await: AwaitMAC, Timeout: time.Hour},
	{Use: "metal.ensureRamdisk", Expand: []Step{
		// A node with no known MAC gets no boot entry: it is power-cycled into PXE first, and
		// the MAC it boots with (under its product UUID) is bound before the entry is made.
		{Use: "management.setBootDevice", Args: map[string]string{"device": "pxe"}, When: WhenNoMACs},
		{Use: "power.cycle", When: WhenNoMACs},
		{Use: "await.macCandidate", When: WhenNoMACs},
		{Use: "boot.prepareRamdisk"},
		{Use: "management.setBootDevice", Args: map[string]string{"device": "pxe"}},
		{Use: "power.cycle", RetryFrom: "boot.prepareRamdisk"},
		{Use: "await.ramdisk"},
	}},
	{Use: "inventory.refresh", Command: "inventory.refresh", Timeout: 5 * time.Minute, Retries: 2},
	// bmc.provisionInband: the ramdisk creates the node's BMC user (the sealed credential the
	// control plane generated) over the host's IPMI interface and reports the BMC's address.
	{Use: "bmc.provisionInband", Command: "bmc.provisionInband", Timeout: 5 * time.Minute, Retries: 1},
	{Use: "diag.dcgm", Command: "diag.dcgm", Timeout: 2 * time.Hour},
	{Use: "disk.wipe", Command: "disk.wipe", Timeout: 24 * time.Hour},
	{Use: "deploy.image", Command: "deploy.image", Timeout: 2 * time.Hour},
	// deploy.configDrive: the ramdisk reads the node's NoCloud documents from the site (served
	// once boot.prepareInstance ran) and writes them to a config drive on the deployed disk, so
	// that cloud-init finds them with no kernel parameter: on the BMC fallback's boot, at every
	// later boot, and where no kexec can run (docs/drivers/cloud-init.md). Its format is
	// NoCloud's (CIDATA) or, with {format: openstack}, OpenStack's (config-2), which
	// cloudbase-init reads too.
	{Use: "deploy.configDrive", Command: "deploy.configDrive", Timeout: 5 * time.Minute, Retries: 2},
	// boot.kexec: the ramdisk kexecs the written disk's kernel and the installed OS rejoins;
	// when the kexec fails or the OS does not rejoin within 10 minutes (a kernel that cannot
	// start after kexec on this hardware), the BMC power-cycles the node into its disk (the
	// boot device is already set) and the OS is awaited again.
	{Use: "boot.kexec", Expand: []Step{
		{Use: "boot.kexecOnce"},
		{Use: "power.cycle", When: WhenNotRejoined},
		{Use: "await.rejoin", When: WhenNotRejoined},
	}},
	{Use: "boot.kexecOnce", Command: "boot.kexec", Await: AwaitRejoin, Timeout: 10 * time.Minute, FallBack: true},
	{Use: "await.rejoin", Await: AwaitRejoin, Timeout: 20 * time.Minute},
	{Use: "metal.revokeIdentity", ControlPlane: true, Timeout: time.Minute},
	// metal.linger leaves the ramdisk up for the node's fast-track window (seed 003 phase 0.9):
	// the node rests with its ramdisk lingering; a workflow started in the window uses it, else
	// the reconciler tells it to power its host off when the window passes.
	{Use: "metal.linger", ControlPlane: true, Timeout: time.Minute},
	{Use: "plugin.httpViaSite", Command: "site.httpProxy", Relays: true, Timeout: 5 * time.Minute, Retries: 1},
}

// LostCheck is how a step finds out whether its command took effect when the command was lost
// (the agent that acknowledged it went away without a result, so it is never sent again):
// the step sends LostCheckCommand{query: Query}; a result whose field Query equals Want
// completes the step, any other answer retries the step by its policy (DESIGN §5: query power,
// then retry or fail).
type LostCheck struct {
	Query string // the bmc.query asked ("power")
	Want  string // the answer that shows the lost command's effect
}

// LostCheckCommand is the command kind of a LostCheck's query.
const LostCheckCommand = "bmc.query"

// lostChecks are the steps a query can settle after a lost command: a command kind with the
// argument value whose effect a query shows. A power cycle leaves the power as it was, so
// nothing tells whether it ran: it is retried. Everything else is idempotent to retry.
var lostChecks = []struct {
	Command, Arg, Value string
	Check               LostCheck
}{
	{Command: "bmc.power", Arg: "action", Value: "off", Check: LostCheck{Query: "power", Want: "off"}},
	{Command: "bmc.power", Arg: "action", Value: "on", Check: LostCheck{Query: "power", Want: "on"}},
}

// LostCheckFor returns the check of a resolved step of kind k whose command was lost; false
// when no query can tell (the step is retried or fails by its policy). Pure.
func LostCheckFor(k StepKind, st Step) (LostCheck, bool) {
	for _, c := range lostChecks {
		if k.Command == c.Command && st.Args[c.Arg] == c.Value {
			return c.Check, true
		}
	}
	return LostCheck{}, false
}

// RetryLost reports whether a resolved step of kind k whose command was lost, and not settled
// by a LostCheck, may send its command again by its retry policy. A lost power action that no
// query can settle (cycle, reset, soft off) may have run: sent again as it is, the machine would
// get it twice (DESIGN §5: bmc.power is never executed twice), so the step fails instead. A step
// that retries from an earlier step (RetryFrom: the ensureRamdisk cycle, after a new boot entry)
// starts a new boot on purpose and keeps its policy. Everything else is idempotent to retry.
// Pure.
func RetryLost(k StepKind, st Step) bool {
	if k.Command != "bmc.power" || st.RetryFrom != "" {
		return true
	}
	_, settled := LostCheckFor(k, st)
	return settled
}

// LookupStep returns the kind of a step.
func LookupStep(use string) (StepKind, error) {
	for _, k := range stepKinds {
		if k.Use == use {
			return k, nil
		}
	}
	names := make([]string, len(stepKinds))
	for i, k := range stepKinds {
		names[i] = k.Use
	}
	return StepKind{}, fmt.Errorf("unknown step %q: known are %s", use, strings.Join(names, ", "))
}

func s(use string, kv ...string) Step {
	st := Step{Use: use}
	if len(kv) > 0 {
		st.Args = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			st.Args[kv[i]] = kv[i+1]
		}
	}
	return st
}

// powerOffOrLinger ends a workflow that leaves the node ready: the BMC powers it off when the
// node's fast-track window is 0, else its ramdisk lingers for the window.
var powerOffOrLinger = [2]Step{{Use: "power.off", When: WhenNoFastTrack}, {Use: "metal.linger", When: WhenFastTrack}}

// firmwareCheck runs where the node's pool has a firmware baseline; commissioning checks it
// first where the pool names no images (firmwareCheckFirst), else after the boot that applied
// the updates (firmwareCheckAfterUpdate).
var (
	firmwareCheck            = Step{Use: "firmware.check", When: WhenFirmwareBaseline}
	firmwareCheckFirst       = Step{Use: "firmware.check", When: WhenBaselineNoImages}
	firmwareUpdate           = Step{Use: "firmware.update", When: WhenFirmwareImages}
	firmwareCheckAfterUpdate = Step{Use: "firmware.check", When: WhenFirmwareImages}
)

// biosApply and biosVerify run where the node's pool names BIOS settings: written before the
// ramdisk's boot, read back once it is up.
var biosApply, biosVerify = Step{Use: "bios.apply", When: WhenBIOSSettings}, Step{Use: "bios.verify", When: WhenBIOSSettings}

// InbandEnrollProfile enrolls a node whose BMC credential is provisioned in-band (it has no BMC
// address until its ramdisk reports one).
const InbandEnrollProfile = "metal-enroll-inband"

// Builtin returns the built-in profiles. Arguments written as "$name" are filled from the
// workflow's parameters (the undeploy verb's wipe mode, the deploy verb's image).
func Builtin() []Profile {
	return []Profile{
		{Name: "metal-enroll", Steps: []Step{s("power.getPower"), s("inspect.oob")}},
		// A machine accepted with --inband (no BMC address yet) is waiting in a discovery-mode
		// ramdisk: it gets a ramdisk entry with a token, joins as the node, provisions its BMC
		// credential in-band, and the site agent then verifies that credential out of band.
		{Name: InbandEnrollProfile, Steps: []Step{s("boot.prepareRamdisk"), s("await.ramdisk"), s("bmc.provisionInband"), s("power.getPower"), s("inspect.oob")}},
		// Inspection always lingers (a window of 0 ends at once): in the enroll chain the
		// commissioning that follows uses the ramdisk; alone, the ramdisk powers its host off.
		{Name: "metal-inspect", Steps: []Step{s("metal.ensureRamdisk"), s("inventory.refresh"), s("metal.linger")}},
		// A pool's firmware baseline is checked first (no boot spent on a machine that drifted)
		// and again at the end of a release (a lessee may have flashed it).
		// Its BIOS settings are written before the ramdisk boots (the boot applies them) and
		// read back once it is up; at release too (a lessee may have changed them).
		// Firmware images are installed before the ramdisk boots too, and the baseline is then
		// checked after that boot.
		{Name: "metal-commission", Steps: []Step{firmwareCheckFirst, firmwareUpdate, biosApply, s("metal.ensureRamdisk"), firmwareCheckAfterUpdate, biosVerify, s("diag.dcgm", "level", "2"), s("disk.wipe", "mode", "quick"), powerOffOrLinger[0], powerOffOrLinger[1]},
			Cleanup: []Step{s("boot.cleanUp")}},
		// Release and retire begin by revoking the node's identity: nothing certified while a
		// lessee had the machine (the installed OS's certificate; the deploy ramdisk's key, which
		// a kexec leaves in the lessee's memory) can speak for the node, nor sign its wipe.
		{Name: "metal-release", Steps: []Step{s("metal.revokeIdentity"), firmwareUpdate, biosApply, s("metal.ensureRamdisk"), biosVerify, s("disk.wipe", "mode", "$wipe"), firmwareCheck, powerOffOrLinger[0], powerOffOrLinger[1]},
			Cleanup: []Step{s("boot.cleanUp")}},
		{Name: "metal-retire", Steps: []Step{s("metal.revokeIdentity"), s("metal.ensureRamdisk"), s("disk.wipe", "mode", "secure"), s("power.off"), s("metal.revokeIdentity")},
			Cleanup: []Step{s("boot.cleanUp")}},
		// The lessee's OS holds the node's identity (and a kexec left the deploy ramdisk's key
		// in its memory): revoked first, so that only the rescue's own ramdisk can be "up".
		{Name: "metal-rescue", Steps: []Step{s("metal.revokeIdentity"), s("metal.ensureRamdisk")}},
		{Name: "metal-unrescue", Steps: []Step{s("management.setBootDevice", "device", "disk", "persistent", "true"), s("boot.prepareInstance"), s("power.cycle"), s("await.rejoin")},
			Cleanup: []Step{s("boot.cleanUp")}},
		{Name: "default", Steps: []Step{s("metal.ensureRamdisk"), s("deploy.image", "image", "$image"), s("management.setBootDevice", "device", "disk", "persistent", "true"), s("boot.prepareInstance"), s("boot.kexec")},
			Cleanup: []Step{s("boot.cleanUp")}},
	}
}

// Resolved is a profile ready to run: composite steps expanded, parameters filled, and the
// command kinds it may send.
type Resolved struct {
	Profile      string
	Steps        []Step
	Cleanup      []Step
	CommandKinds []string
}

// Resolve expands and fills a profile. Every "$param" must be given; every step must exist;
// a plugin profile's extra sends must be known command kinds.
func Resolve(p Profile, params map[string]string) (Resolved, error) {
	r := Resolved{Profile: p.Name}
	kinds := map[string]bool{}
	var expand func(in []Step, depth int) ([]Step, error)
	expand = func(in []Step, depth int) ([]Step, error) {
		if depth > 4 {
			return nil, fmt.Errorf("profile %s: steps expand too deep", p.Name)
		}
		var out []Step
		for _, st := range in {
			k, err := LookupStep(st.Use)
			if err != nil {
				return nil, fmt.Errorf("profile %s: %w", p.Name, err)
			}
			if len(k.Expand) > 0 {
				if st.Timeout != 0 || st.Retries != 0 {
					var parts []string
					for _, e := range k.Expand {
						parts = append(parts, e.Use)
					}
					return nil, fmt.Errorf("profile %s: step %s is made of %s: it takes no timeout or retries of its own (its parts have theirs)", p.Name, st.Use, strings.Join(parts, ", "))
				}
				parts, err := compositeArgs(k, st)
				if err != nil {
					return nil, fmt.Errorf("profile %s: %w", p.Name, err)
				}
				sub, err := expand(parts, depth+1)
				if err != nil {
					return nil, err
				}
				if st.Use == "metal.ensureRamdisk" {
					for i := range sub {
						sub[i].FastTrack = true
					}
				}
				out = append(out, sub...)
				continue
			}
			filled := Step{Use: st.Use, On: st.On, Timeout: st.Timeout, Retries: st.Retries, When: st.When, RetryFrom: st.RetryFrom, Args: map[string]string{}}
			maps.Copy(filled.Args, k.Args)
			for key, v := range st.Args {
				if name, ok := strings.CutPrefix(v, "$"); ok {
					pv, ok := params[name]
					if !ok || pv == "" {
						return nil, fmt.Errorf("profile %s: step %s needs parameter %q", p.Name, st.Use, name)
					}
					v = pv
				}
				filled.Args[key] = v
			}
			if err := checkStep(k, st, filled); err != nil {
				return nil, fmt.Errorf("profile %s: step %s: %w", p.Name, st.Use, err)
			}
			if filled.Timeout == 0 {
				filled.Timeout = k.Timeout
			}
			if filled.Retries == 0 {
				filled.Retries = k.Retries
			}
			if filled.Retries < 0 {
				filled.Retries = 0 // an override's "retries": 0
			}
			if st.When == WhenOverridden {
				out = append(out, filled) // never sent: no command kind
				continue
			}
			if k.Command != "" && !k.Relays {
				kinds[k.Command] = true
			}
			if _, ok := LostCheckFor(k, filled); ok {
				kinds[LostCheckCommand] = true // the query that settles the step's lost command
			}
			out = append(out, filled)
		}
		return out, nil
	}
	var err error
	if r.Steps, err = expand(p.Steps, 0); err != nil {
		return Resolved{}, err
	}
	if r.Cleanup, err = expand(p.Cleanup, 0); err != nil {
		return Resolved{}, err
	}
	if err := checkConfigDrive(r.Steps, r.Cleanup); err != nil {
		return Resolved{}, fmt.Errorf("profile %s: %w", p.Name, err)
	}
	for _, k := range p.Sends {
		if _, err := command.Lookup(k); err != nil {
			return Resolved{}, fmt.Errorf("profile %s declares sends: %w", p.Name, err)
		}
		kinds[k] = true
	}
	r.CommandKinds = slices.Sorted(maps.Keys(kinds))
	return r, nil
}

// checkConfigDrive refuses a deploy.configDrive that cannot work: before any
// boot.prepareInstance (the site serves the node's documents only once it ran), in cleanup, or
// beside a boot.kexec guest that reads none of it (Ignition). Pure.
func checkConfigDrive(steps, cleanup []Step) error {
	if slices.ContainsFunc(cleanup, func(st Step) bool { return st.Use == ConfigDriveStep }) {
		return fmt.Errorf("%s is not a cleanup step: it belongs after boot.prepareInstance among the steps", ConfigDriveStep)
	}
	prepared := false
	for _, st := range steps {
		switch st.Use {
		case "boot.prepareInstance":
			prepared = true
		case ConfigDriveStep:
			if !prepared {
				return fmt.Errorf("%s reads the node's NoCloud documents from the site, which serves them once boot.prepareInstance ran: put it after boot.prepareInstance", ConfigDriveStep)
			}
		case "boot.kexecOnce":
			if g := st.Args["guest"]; g != "" && g != "none" && g != GuestCloudInit && slices.ContainsFunc(steps, func(st Step) bool { return st.Use == ConfigDriveStep }) {
				return fmt.Errorf("%s writes a cloud-init config drive (NoCloud or OpenStack), which boot.kexec's guest %s does not read: use guest cloud-init or none with it", ConfigDriveStep, g)
			}
		}
	}
	return nil
}

// ConfigDriveStep is the step that writes a config drive; GuestCloudInit the guest that reads it.
const (
	ConfigDriveStep = "deploy.configDrive"
	GuestCloudInit  = "cloud-init"
)

// UserDataGuest is what reads the operator's user-data in a resolved deploy: boot.kexec's guest
// when it names one, else cloud-init where a config drive carries it, else "" (nothing reads
// any). Pure.
func UserDataGuest(steps []Step) string {
	guest := ""
	for _, st := range steps {
		if g := st.Args["guest"]; st.Use == "boot.kexecOnce" && g != "" && g != "none" {
			guest = g
		}
	}
	if guest == "" && slices.ContainsFunc(steps, func(st Step) bool { return st.Use == ConfigDriveStep }) {
		guest = GuestCloudInit
	}
	return guest
}

// argRules are the values a step kind's command arguments may take ("" in a list: the argument
// may be left out), by command kind and argument. What a profile writes there reaches an agent
// as is: a BMC, a disk or the diagnostics would otherwise be handed a value nothing checked.
var argRules = map[string]map[string][]string{
	"bmc.power":    {"action": powerActions()},
	"bmc.boot":     {"device": {string(bmc.BootPXE), string(bmc.BootDisk), string(bmc.BootCD)}, "persistent": {"", "true", "false"}, "mode": {"", string(bmc.BootModeUEFI), string(bmc.BootModeLegacy)}},
	"bmc.media":    {"action": {"insert", "eject"}},
	"bmc.query":    {"query": {"power", "inventory", "firmware", "bios"}},
	"disk.wipe":    {"mode": {"quick", "full", "secure"}},
	"diag.dcgm":    {"level": {"1", "2", "3", "4"}},
	"deploy.image": {"image": nil},
	// boot.kexec's guest: the kernel parameters the ramdisk appends so that an image without
	// bcd's agent finds the site's datasource and proves it booted (docs/drivers/cloud-init.md;
	// kexec.Guests, a test pins them equal).
	"boot.kexec": {"guest": {"", "none", "cloud-init", "ignition"}},
	// deploy.configDrive's format: cloud-init's NoCloud layout (the default) or OpenStack's
	// (agent.FormatNoCloud, FormatOpenStack; a test pins them equal).
	"deploy.configDrive": {"format": {"", "nocloud", "openstack"}},
}

// freeArgs are optional command arguments with no fixed values, checked where they are used:
// boot.kexec's and deploy.configDrive's guestSite, the site's boot HTTP URL the guest parameters
// name and the config drive is read from (the ramdisk refuses one that is not
// http(s)://host[:port]); media.insert's image, the catalog ISO (checked when its command is
// built).
var freeArgs = map[string][]string{"boot.kexec": {"guestSite"}, "deploy.configDrive": {"guestSite"}, "bmc.media": {"image"}}

// takesArg says whether a step kind's command takes argument key (argRules or freeArgs).
func takesArg(k StepKind, key string) bool {
	_, ruled := argRules[k.Command][key]
	return k.Command != "" && (ruled || slices.Contains(freeArgs[k.Command], key))
}

// compositeArgs are k's parts with the arguments a profile gave the composite step st, each
// given to every part whose command takes it and that does not set it itself
// (boot.kexec{guest: cloud-init} reaches boot.kexecOnce, which sends boot.kexec). An argument
// no part takes is refused: dropped, it would be a setting that silently does nothing. Pure.
func compositeArgs(k StepKind, st Step) ([]Step, error) {
	parts := slices.Clone(k.Expand)
	var takes []string
	for _, part := range parts {
		pk, err := LookupStep(part.Use)
		if err != nil {
			return nil, err
		}
		for key := range argRules[pk.Command] {
			takes = append(takes, key)
		}
		takes = append(takes, freeArgs[pk.Command]...)
	}
	slices.Sort(takes)
	takes = slices.Compact(takes)
	for _, key := range slices.Sorted(maps.Keys(st.Args)) {
		taken := false
		for i := range parts {
			pk, _ := LookupStep(parts[i].Use) // looked up above
			if _, own := parts[i].Args[key]; own || !takesArg(pk, key) {
				continue // a part's own argument stays (metal.ensureRamdisk boots from pxe)
			}
			args := maps.Clone(parts[i].Args)
			if args == nil {
				args = map[string]string{}
			}
			args[key] = st.Args[key]
			parts[i].Args = args
			taken = true
		}
		if !taken {
			if len(takes) == 0 {
				return nil, fmt.Errorf("step %s takes no arguments (%s given)", st.Use, key)
			}
			return nil, fmt.Errorf("step %s takes no argument %s: its parts take %s", st.Use, key, strings.Join(takes, ", "))
		}
	}
	return parts, nil
}

// describeArgs says which arguments a step kind takes. Pure.
func describeArgs(k StepKind) string {
	var keys []string
	for key := range argRules[k.Command] {
		if _, fixed := k.Args[key]; !fixed {
			keys = append(keys, key)
		}
	}
	keys = append(keys, freeArgs[k.Command]...)
	if len(keys) == 0 {
		return "it takes none"
	}
	slices.Sort(keys)
	return "it takes " + strings.Join(keys, ", ")
}

func powerActions() []string {
	out := make([]string, len(bmc.PowerActions))
	for i, a := range bmc.PowerActions {
		out[i] = string(a)
	}
	return out
}

// checkStep validates a step as a profile wrote it (st) and as filled with the kind's fixed
// arguments and the workflow's parameters (filled): a fixed argument cannot be changed
// (power.off{action: cycle} is not a power off), a routing names where the kind's command runs,
// and every argument with rules holds one of its accepted values (nil rules: any non-empty
// value). Pure.
func checkStep(k StepKind, st, filled Step) error {
	for key, v := range st.Args {
		if fixed, ok := k.Args[key]; ok && filled.Args[key] != fixed {
			return fmt.Errorf("argument %s is %q by the step's kind: it cannot be set to %q", key, fixed, v)
		}
	}
	if st.On != "" {
		if k.Command == "" {
			return fmt.Errorf("on: %q: the step sends no command to route", st.On)
		}
		kind, err := command.Lookup(k.Command)
		if err != nil {
			return err
		}
		if st.On != string(kind.RunsOn) {
			return fmt.Errorf("on: %q: its command %s runs on %s only", st.On, k.Command, kind.RunsOn)
		}
	}
	if k.Command == "" || k.Relays || st.When == WhenOverridden {
		return nil // an overridden-off step's arguments are the override table's (level 0)
	}
	for _, key := range slices.Sorted(maps.Keys(st.Args)) {
		if _, fixed := k.Args[key]; !fixed && !takesArg(k, key) {
			// Dropped, a misspelt argument (disk.wipe{mdoe: full}) would silently do the default.
			return fmt.Errorf("takes no argument %s: %s", key, describeArgs(k))
		}
	}
	for key, accepted := range argRules[k.Command] {
		v, given := filled.Args[key]
		switch {
		case accepted == nil && v == "":
			return fmt.Errorf("argument %s is required", key)
		case accepted == nil:
		case !slices.Contains(accepted, v) && (given || !slices.Contains(accepted, "")):
			var show []string
			for _, a := range accepted {
				if a != "" {
					show = append(show, a)
				}
			}
			if !given {
				return fmt.Errorf("argument %s is required: accepted are %s", key, strings.Join(show, ", "))
			}
			return fmt.Errorf("argument %s %q: accepted are %s", key, v, strings.Join(show, ", "))
		}
	}
	return nil
}

// Find returns the built-in or operator profile named name.
func Find(name string, extra []Profile) (Profile, error) {
	for _, p := range extra {
		if p.Name == name {
			return p, nil
		}
	}
	if p, ok := builtin(name); ok {
		return p, nil
	}
	return Profile{}, fmt.Errorf("unknown profile %q", name)
}

// ParseProfile decodes an operator-defined deploy profile from JSON, refusing unknown fields,
// and checks it resolves (every step known, declared sends known). Steps' timeouts are Go
// durations ("90s", "2h"). A built-in metal-* name takes only an override of that profile
// ({"override": {…}}, see ApplyOverride) and gives the overridden built-in profile.
func ParseProfile(name string, def []byte) (Profile, error) {
	if Overridable(name) {
		return parseOverride(name, def)
	}
	var raw struct {
		Steps   []rawStep `json:"steps"`
		Cleanup []rawStep `json:"cleanup"`
		Sends   []string  `json:"sends"`
	}
	dec := json.NewDecoder(bytes.NewReader(def))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return Profile{}, fmt.Errorf("profile %s is not valid: %w (expected {\"steps\":[{\"use\":…,\"args\":{…},\"timeout\":\"90s\",\"retries\":1}],\"cleanup\":[…],\"sends\":[…]})", name, err)
	}
	p := Profile{Name: name, Sends: raw.Sends}
	conv := func(in []rawStep) ([]Step, error) {
		var out []Step
		for _, r := range in {
			st := Step{Use: r.Use, Args: r.Args, On: r.On, Retries: r.Retries}
			if r.Timeout != "" {
				d, err := time.ParseDuration(r.Timeout)
				if err != nil || d <= 0 || d > maxStepTimeout {
					return nil, fmt.Errorf("profile %s: step %s: timeout %q: use a duration between 1s and 48h", name, r.Use, r.Timeout)
				}
				st.Timeout = d
			}
			if r.Retries < 0 || r.Retries > maxRetries {
				return nil, fmt.Errorf("profile %s: step %s: retries %d: accepted are 0-%d", name, r.Use, r.Retries, maxRetries)
			}
			out = append(out, st)
		}
		return out, nil
	}
	var err error
	if p.Steps, err = conv(raw.Steps); err != nil {
		return Profile{}, err
	}
	if p.Cleanup, err = conv(raw.Cleanup); err != nil {
		return Profile{}, err
	}
	if len(p.Steps) == 0 {
		return Profile{}, fmt.Errorf("profile %s has no steps", name)
	}
	// Resolve with placeholder parameters to check every step and send.
	if _, err := Resolve(p, map[string]string{"image": "x", "wipe": "quick"}); err != nil {
		return Profile{}, err
	}
	return p, nil
}

type rawStep struct {
	Use     string            `json:"use"`
	Args    map[string]string `json:"args,omitempty"`
	On      string            `json:"on,omitempty"`
	Timeout string            `json:"timeout,omitempty"`
	Retries int               `json:"retries,omitempty"`
}
