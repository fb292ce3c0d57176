// Package sim simulates machines for the engine: BMCs, a site agent and ramdisks that speak to
// the control plane through the same calls the gateway makes (claim, acknowledge, report, join,
// connect), with configurable latency and failure injection. Every command execution is counted
// per command id, so a test can prove nothing ran twice.
package sim

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/bmc"
	"bcd/internal/engine"
	"bcd/internal/pki"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/store"
)

// Link is what the simulated agents need from the control plane: the gateway's calls.
type Link interface {
	Claim(ctx context.Context, a engine.Agent, limit int) ([]store.Command, error)
	AckAll(ctx context.Context, a engine.Agent, commandIDs []string) (map[string]error, error)
	Report(ctx context.Context, a engine.Agent, u engine.Update) error
	Connected(ctx context.Context, a engine.Agent, version string) error
	Disconnected(ctx context.Context, a engine.Agent) error
	JoinNode(ctx context.Context, token string, csrDER []byte, kind string) ([]byte, string, uint64, error)
	Subscribe(a engine.Agent) (<-chan struct{}, func())
	RecordDiscovered(ctx context.Context, a engine.Agent, ds []engine.Discovery) error
}

// cpuBounder is a link in this process whose CPU-heavy work goes through a gate that leaves the
// store's writer a processor (engine.Engine.CPUBound): the simulated machines' own cryptography
// (keys, certificate requests, signed results), which real machines do on their own processors,
// goes through it too, so the simulation does not take from the server what a fleet would not.
type cpuBounder interface {
	CPUBound(ctx context.Context, f func()) error
}

// cpuBound runs f through the link's gate, if it has one (in process), else at once.
func (s *Sim) cpuBound(ctx context.Context, f func()) error {
	if g, ok := s.link.(cpuBounder); ok {
		return g.CPUBound(ctx, f)
	}
	f()
	return nil
}

// keyAndCSR is a simulated machine's key and certificate request named name: one made ahead
// (MakeKeys) if any is left, else one made now (cpuBound).
func (s *Sim) keyAndCSR(ctx context.Context, name string) (key crypto.Signer, csr []byte, err error) {
	if key, csr, ok := s.keys.take(); ok {
		return key, csr, nil
	}
	if gerr := s.cpuBound(ctx, func() { key, csr, err = pki.NewKeyAndCSR(name) }); gerr != nil {
		return nil, nil, gerr
	}
	return key, csr, err
}

// Faults injects failures.
type Faults struct {
	// Hang makes agents acknowledge these kinds and never report on them.
	Hang             map[string]bool
	BMCErrorRate     float64 // a BMC command fails
	WipeReadbackFail float64 // a wipe reports a disk whose read-back failed
	// UnsignedWipe makes ramdisks send wipe results without a signature.
	UnsignedWipe bool
	// KexecFail makes ramdisks fail boot.kexec (the kernel cannot be loaded) and stay up.
	KexecFail bool
	// Rotate makes bmc.rotate go wrong: "fail" (the BMC refuses the password), "unsigned" (the
	// result carries no signature), "unverified" (verified: false), "forged" (signed with a key
	// that is not the certificate's).
	Rotate string
	// SiteAgentDeath is the chance, for each command the in-process site agent receives, that
	// the agent dies holding it: a third of the time as it receives it (before acknowledging
	// it), a third before running it, a third after (the BMC did it); it never reports it.
	// What the agent had not started dies with it. A standby agent of the site (the next id)
	// connects at once: the engine moves to it what the dead agent never acknowledged, and
	// makes what it acknowledged lost once its grace period passed — never sent again.
	SiteAgentDeath float64
	// RamdiskDeath is the chance, for each command a node's in-process ramdisk receives, that
	// the ramdisk crashes holding it (as SiteAgentDeath, at one of three points): the
	// machine stays on with nothing running, and only a new boot brings a ramdisk back. A kexec
	// or a power-off, which end the ramdisk anyway, are spared.
	RamdiskDeath float64
	// DieOnClaim, DieBefore and DieAfter make the in-process agent that runs the commands they
	// name (the site agent, or a node's ramdisk) die as it receives them (before acknowledging
	// them), before running them or after, as many times as the count says: "kind:action"
	// (bmc.power:off) or a kind (disk.wipe).
	DieOnClaim, DieBefore, DieAfter map[string]int
	// SitePaused makes the site agent take no command while it is set, its connection up: a
	// backlog at a busy site, as far as the commands waiting are concerned.
	SitePaused bool
}

// mortality is how an in-process agent dies holding a command: fate decides, die ends its
// life, deaths counts the lives ended.
type mortality struct {
	fate   func(store.Command) death
	die    context.CancelFunc
	deaths *atomic.Int32
	dead   atomic.Bool // this life ended: nothing it held is reported
}

// death is when a site agent dies holding a command.
type death int

const (
	lives       death = iota
	diesOnClaim       // as it receives the command, before acknowledging it
	diesBefore        // acknowledged, before running it
	diesAfter         // after running it, before reporting
)

// siteDeath decides whether the site agent dies holding c.
func (s *Sim) siteDeath(c store.Command) death {
	return s.deathOf(c, s.faults().SiteAgentDeath)
}

// ramdiskDeath decides whether a ramdisk dies holding c.
func (s *Sim) ramdiskDeath(c store.Command) death {
	if c.Kind == "boot.kexec" || c.Kind == "ramdisk.powerOff" {
		return lives
	}
	return s.deathOf(c, s.faults().RamdiskDeath)
}

// deathOf decides whether an agent dies holding c: DieOnClaim, DieBefore, DieAfter, else at
// rate (each of the three points alike).
func (s *Sim) deathOf(c store.Command, rate float64) death {
	s.fmu.Lock()
	f := s.cfg.Faults
	if len(f.DieOnClaim)+len(f.DieBefore)+len(f.DieAfter) > 0 {
		key := c.Kind
		var args siteArgs
		if json.Unmarshal([]byte(c.Args), &args) == nil && args.Action != "" {
			key += ":" + args.Action
		}
		for _, d := range []struct {
			m    map[string]int
			when death
		}{{f.DieOnClaim, diesOnClaim}, {f.DieBefore, diesBefore}, {f.DieAfter, diesAfter}} {
			for _, k := range []string{key, c.Kind} {
				if d.m[k] > 0 {
					d.m[k]--
					s.fmu.Unlock()
					return d.when
				}
			}
		}
	}
	s.fmu.Unlock()
	if !s.chance(rate) {
		return lives
	}
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return diesOnClaim + death(s.rng.IntN(3))
}

// died ends an agent's life, counted once: several commands may kill it together.
func (s *Sim) died(life context.Context, m *mortality) {
	s.deathMu.Lock()
	defer s.deathMu.Unlock()
	if life.Err() == nil {
		m.deaths.Add(1)
	}
	m.dead.Store(true)
	m.die()
}

// SiteAgentDeaths counts the in-process site agents that died (Faults.SiteAgentDeath,
// DieOnClaim, DieBefore, DieAfter).
func (s *Sim) SiteAgentDeaths() int { return int(s.deaths.Load()) }

// RamdiskDeaths counts the in-process ramdisks that died (Faults.RamdiskDeath, DieOnClaim,
// DieBefore, DieAfter).
func (s *Sim) RamdiskDeaths() int { return int(s.ramdiskDeaths.Load()) }

// Config of a simulation.
type Config struct {
	// Gateway, when set, makes machines boot agents that dial the real agent gateway
	// (agentlink over mTLS) instead of calling the engine in-process.
	Gateway   *GatewayTarget
	SiteID    string
	Latency   time.Duration // per BMC or ramdisk command
	BootDelay time.Duration // power-on → ramdisk joined
	Faults    Faults
	Seed      uint64
}

// The firmware versions a simulated machine reports unless told otherwise (Machine.Firmware).
const (
	SimFirmwareBIOS = "sim-bios-1.0"
	SimFirmwareBMC  = "sim-bmc-1.0"
)

// Machine is one simulated machine.
type Machine struct {
	NodeID string
	UUID   string
	MACs   []string
	// PXEUUID is the UUID iPXE reports when the machine network-boots (SMBIOS byte order may
	// differ from UUID's); empty: UUID.
	PXEUUID string
	// NoOOBMACs: the BMC reports no NIC (IPMI): out-of-band inspection finds no MAC.
	NoOOBMACs bool
	// Discovering: the machine is on and waits in a discovery-mode ramdisk (acceptance flow):
	// the first ramdisk entry made for it is its decision, and it joins with that entry's token
	// without a power cycle.
	Discovering bool
	// NoVirtualMedia: the BMC has no virtual media: bmc.media falls back to an iPXE sanboot
	// entry at the site (as the site agent does).
	NoVirtualMedia bool
	// InbandBMC is the BMC address the host reports over its IPMI system interface
	// (bmc.provisionInband); empty: the host has no IPMI interface.
	InbandBMC string
	// Firmware is what the BMC reports to bmc.query{query: firmware} (the firmware.check
	// step); nil: BIOS SimFirmwareBIOS and BMC SimFirmwareBMC.
	Firmware []bmc.Firmware
	// IgnoreBIOSSettings: the BMC takes BIOS settings (bmc.bios) and never applies them (the
	// silent vendor failure bios.verify catches).
	IgnoreBIOSSettings bool
	// FirmwareUpdateFails: the BMC's update task ends in an error (bmc.firmware fails);
	// FirmwareUpdateIgnored: it ends well and the old version still runs after the reset.
	FirmwareUpdateFails, FirmwareUpdateIgnored bool
	// Hardware is what the machine's ramdisk reports of it (inventory.refresh), beside its UUID
	// and MACs (which the report always carries); nil: SimHardware. Once the machine is added,
	// SetHardware changes it.
	Hardware *inventory.Inventory

	mu            sync.Mutex
	power         bool
	bootDev       string
	entry         bool
	token         string
	instanceToken string
	ramdisk       context.CancelFunc
	osUp          bool
	osGeneration  uint64 // the installed OS keeps its certificate across reboots
	// osToken is the instance token the OS's kept certificate was joined with: a newer one (a
	// rescue revoked the lease's identity, and unrescue minted it) means the gateway refuses
	// the kept certificate, and the OS joins again with the token its metadata serves, as
	// internal/osagent does.
	osToken string
	osLink  func() // gateway mode: stops the installed OS's agent
	Disk    string // "data", "wiped", "image"
	Media   string // the URL of the ISO in the machine's virtual CD ("" empty)
	// BIOS holds the BIOS attributes (nil until first used: SimBIOS), biosPending the settings
	// written and applied at the next power-on, BIOSWrites the bmc.bios commands that wrote any.
	BIOS        map[string]string
	biosPending map[string]string
	BIOSWrites  int
	// fwPending are the versions installed, running from the next power-on; FirmwareUpdates the
	// images installed.
	fwPending       map[string]string
	FirmwareUpdates int
}

// firmware is what the machine's BMC reports (m.mu held): Machine.Firmware, else the defaults.
func (m *Machine) firmware() []bmc.Firmware {
	if m.Firmware == nil {
		m.Firmware = []bmc.Firmware{{ID: "BIOS", Name: "BIOS", Version: SimFirmwareBIOS}, {ID: "BMC", Name: "BMC", Version: SimFirmwareBMC}}
	}
	return m.Firmware
}

// SimBIOS are the BIOS attributes a simulated machine starts with.
func SimBIOS() map[string]string {
	return map[string]string{"ProcVirtualization": "Enabled", "SriovGlobalEnable": "Disabled", "ProcCStates": "Enabled", "ProcCoreDisable": "0"}
}

// bios is the machine's BIOS attributes (m.mu held).
func (m *Machine) bios() map[string]string {
	if m.BIOS == nil {
		m.BIOS = SimBIOS()
	}
	return m.BIOS
}

// Sim runs a site agent and the machines.
type Sim struct {
	cfg Config
	fmu sync.Mutex // guards cfg.Faults
	// pause is held (read) by the site agent from its look at SitePaused to the end of its
	// claim, and (write) by SetFaults: once SetFaults returns, no claim made under the old
	// faults is still in flight, so a command queued after it waits if SitePaused says so.
	pause sync.RWMutex
	link  Link
	mu    sync.Mutex
	byID  map[string]*Machine
	execs *execCounts
	rng   *rand.Rand
	rngMu sync.Mutex
	wg    sync.WaitGroup
	errs  chan error
	// siteKey and siteCert are the in-process site agent's identity: it signs bmc.rotate results.
	siteKey  crypto.Signer
	siteCert []byte
	// siteAgent reports machines that PXE-boot with no boot entry: in-process, the engine's
	// RecordDiscovered as the agent; over the gateway, the site link's status.
	siteAgent  engine.Agent
	siteStatus func([]agentlink.Discovered)
	seen       map[string]agentlink.Discovered
	selfOffs   atomic.Int32
	deathMu    sync.Mutex
	// deaths and ramdiskDeaths count the site agents and ramdisks that died (mortality).
	deaths, ramdiskDeaths atomic.Int32
	// conns numbers the simulated ramdisks' connections.
	conns atomic.Int64
	// keys are the machines' keys made ahead (MakeKeys), presigs the presignatures their
	// signed results take (MakePresignatures).
	keys    keyStock
	presigs presigStock
}

// SetSiteIdentity gives the in-process site agent the key and certificate it signs site
// statements (bmc.rotate results) with.
func (s *Sim) SetSiteIdentity(key crypto.Signer, certDER []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.siteKey, s.siteCert = key, certDER
}

// New builds a simulation for the site.
func New(cfg Config, link Link) *Sim {
	return &Sim{cfg: cfg, link: link, byID: map[string]*Machine{}, execs: newExecCounts(), rng: rand.New(rand.NewPCG(cfg.Seed, 7)), errs: make(chan error, 16)}
}

// SetFaults changes the injected failures.
func (s *Sim) SetFaults(f Faults) {
	s.pause.Lock()
	defer s.pause.Unlock()
	s.fmu.Lock()
	defer s.fmu.Unlock()
	s.cfg.Faults = f
}

// DeathsPending counts the deaths Faults.DieOnClaim, DieBefore and DieAfter asked for that have
// not happened yet.
func (s *Sim) DeathsPending() int {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	n := 0
	for _, m := range []map[string]int{s.cfg.Faults.DieOnClaim, s.cfg.Faults.DieBefore, s.cfg.Faults.DieAfter} {
		for _, c := range m {
			n += c
		}
	}
	return n
}

func (s *Sim) faults() Faults {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	return s.cfg.Faults
}

// Add registers a machine (its node id, product UUID and MACs as enrolled).
func (s *Sim) Add(m *Machine) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m.Disk == "" {
		m.Disk = "data"
	}
	if m.Discovering {
		m.power, m.bootDev = true, "pxe"
	}
	s.byID[m.NodeID] = m
}

// Machine returns a registered machine.
func (s *Sim) Machine(nodeID string) *Machine {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[nodeID]
}

// Executions returns how many times each command ran.
func (s *Sim) Executions() map[string]int {
	return s.execs.all()
}

// ExecutionSummary returns how many commands ran, and how many of them ran more than once.
func (s *Sim) ExecutionSummary() (commands, ranTwice int) { return s.execs.summary() }

func (s *Sim) counted(id string) {
	s.execs.add(id)
}

func (s *Sim) chance(p float64) bool {
	if p <= 0 {
		return false
	}
	s.rngMu.Lock()
	defer s.rngMu.Unlock()
	return s.rng.Float64() < p
}

func (s *Sim) fail(err error) {
	select {
	case s.errs <- err:
	default:
	}
}

// Errors reports unexpected errors of the simulated agents.
func (s *Sim) Errors() <-chan error { return s.errs }

// Wait waits for every goroutine the simulation started after ctx ended.
func (s *Sim) Wait() { s.wg.Wait() }

// RunSiteAgent serves the site's commands as site agent id until ctx ends. When the agent dies
// (Faults.SiteAgentDeath, DieOnClaim, DieBefore, DieAfter) a standby takes over as id.1, id.2, …
func (s *Sim) RunSiteAgent(ctx context.Context, id string) {
	for n := 0; ctx.Err() == nil; n++ {
		a := engine.Agent{ID: id, Kind: "site", SiteID: s.cfg.SiteID}
		if n > 0 {
			a.ID = fmt.Sprintf("%s.%d", id, n)
		}
		s.mu.Lock()
		s.siteAgent = a
		s.mu.Unlock()
		if err := s.link.Connected(ctx, a, "sim"); err != nil {
			s.fail(err)
			return
		}
		life, die := context.WithCancel(ctx)
		ch, stop := s.link.Subscribe(a)
		// Machines a command powers on outlive the agent that sent it: they run under ctx.
		s.serve(life, a, ch, 200*time.Millisecond, func(_ context.Context, a engine.Agent, c store.Command) engine.Update {
			return s.siteCommand(ctx, a, c)
		}, &mortality{fate: s.siteDeath, die: die, deaths: &s.deaths})
		stop()
		die()
		// Its connection drops (a dead agent says nothing more).
		s.link.Disconnected(context.WithoutCancel(ctx), a)
	}
}

// serve claims, acknowledges and runs commands until ctx ends. wake is the engine's
// notification; every poll a claim is made anyway (a safety net: each claim is a write
// transaction, so thousands of idle ramdisks poll rarely). mort ends ctx when the agent dies
// holding a command.
//
// As over the agent gateway, where a stream sends the next frame of commands without waiting
// for the agent to acknowledge the last, the next claim is made while the previous batch's
// acknowledgement is written: batches are acknowledged one at a time, in order, and at most
// claimWindow batches are claimed and not yet acknowledged (the gateway's Window).
func (s *Sim) serve(ctx context.Context, a engine.Agent, wake <-chan struct{}, poll time.Duration, run func(ctx context.Context, a engine.Agent, c store.Command) engine.Update, mort *mortality) {
	tick := time.NewTicker(poll)
	defer tick.Stop()
	var acks sync.WaitGroup
	defer acks.Wait() // the agent's last acknowledgements are written (or refused) before it is gone
	window := make(chan struct{}, claimWindow)
	prev := make(chan struct{})
	close(prev)
	for ctx.Err() == nil {
		select {
		case window <- struct{}{}:
		case <-ctx.Done():
			return
		}
		cmds, paused, err := s.claim(ctx, a)
		if len(cmds) == 0 {
			<-window
		}
		if paused {
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
			continue
		}
		if err != nil && ctx.Err() == nil {
			s.fail(fmt.Errorf("%s claiming: %w", a.ID, err))
		}
		fates := make([]death, len(cmds))
		for i, c := range cmds {
			fates[i] = mort.fate(c)
		}
		if slices.Contains(fates, diesOnClaim) {
			s.died(ctx, mort) // the frame arrived; nothing of it was recorded or acknowledged
			return
		}
		if len(cmds) > 0 {
			done := make(chan struct{})
			acks.Add(1)
			go func(prev <-chan struct{}) {
				defer acks.Done()
				defer close(done)
				defer func() { <-window }()
				<-prev
				s.start(ctx, a, cmds, fates, run, mort)
			}(prev)
			prev = done
		}
		if len(cmds) == claimBatch {
			continue
		}
		select {
		case <-ctx.Done():
		case <-wake:
		case <-tick.C:
		}
	}
}

// claimBatch is the most commands one claim takes; claimWindow the most claims whose batches
// are not yet acknowledged.
const claimBatch, claimWindow = 512, 8

// start acknowledges cmds, one batch (the agent recorded them), then runs those whose
// acknowledgement was recorded: as agentlink journals the commands of one frame together and
// acknowledges them in one frame.
func (s *Sim) start(ctx context.Context, a engine.Agent, cmds []store.Command, fates []death, run func(ctx context.Context, a engine.Agent, c store.Command) engine.Update, mort *mortality) {
	if ctx.Err() != nil {
		return // the agent died since the claim: it acknowledges nothing more
	}
	ids := make([]string, len(cmds))
	for i, c := range cmds {
		ids[i] = c.ID
	}
	refused, err := s.link.AckAll(ctx, a, ids)
	if err != nil {
		if ctx.Err() == nil {
			s.fail(fmt.Errorf("%s acknowledging %d commands: %w", a.ID, len(ids), err))
		}
		return
	}
	for i, c := range cmds {
		if err := refused[c.ID]; err != nil {
			if !errors.Is(err, engine.ErrFinished) { // cancelled since the claim: not run
				s.fail(fmt.Errorf("%s acknowledging %s: %w", a.ID, c.ID, err))
			}
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			d := fates[i]
			if d == diesBefore {
				s.died(ctx, mort)
			}
			if ctx.Err() != nil {
				return // the agent is dead, or its machine went down: what it had not started never runs
			}
			s.counted(c.ID)
			if s.faults().Hang[c.Kind] {
				return
			}
			u := run(ctx, a, c)
			u.CommandID = c.ID
			if d == diesAfter {
				s.died(ctx, mort)
			}
			if u.State == "" || mort.dead.Load() {
				return // self-terminating (reported elsewhere), or its agent died holding it
			}
			if err := s.link.Report(context.WithoutCancel(ctx), a, u); err != nil && ctx.Err() == nil {
				s.fail(fmt.Errorf("%s reporting %s: %w", a.ID, c.ID, err))
			}
		}()
	}
}

// claim claims a's commands, unless a is the site agent and SitePaused is set; the look at
// the faults and the claim are one step as far as SetFaults is concerned.
func (s *Sim) claim(ctx context.Context, a engine.Agent) (cmds []store.Command, paused bool, err error) {
	if a.Kind == "site" {
		s.pause.RLock()
		defer s.pause.RUnlock()
		if s.faults().SitePaused {
			return nil, true, nil
		}
	}
	cmds, err = s.link.Claim(ctx, a, claimBatch)
	return cmds, false, err
}

func (s *Sim) sleep(ctx context.Context) {
	if s.cfg.Latency <= 0 {
		return
	}
	t := time.NewTimer(s.cfg.Latency)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

type siteArgs struct {
	NodeID     string              `json:"nodeId"`
	Attributes map[string]string   `json:"attributes"`
	Names      []string            `json:"names"`
	Updates    []bmc.FirmwareImage `json:"updates"`
	MACs       []string            `json:"macs"`
	Query      string              `json:"query"`
	Action     string              `json:"action"`
	Device     string              `json:"device"`
	Token      string              `json:"token"`
	Image      string              `json:"image"`
	URL        string              `json:"url"`
	SHA256     string              `json:"sha256"`
}

func ok(result any) engine.Update {
	b, _ := json.Marshal(result)
	return engine.Update{State: "succeeded", Result: b}
}

func failed(msg string) engine.Update { return engine.Update{State: "failed", Error: msg} }

func (s *Sim) siteCommand(ctx context.Context, a engine.Agent, c store.Command) engine.Update {
	var args siteArgs
	if err := json.Unmarshal([]byte(c.Args), &args); err != nil {
		return failed("bad arguments: " + err.Error())
	}
	m := s.Machine(args.NodeID)
	if m == nil {
		return failed("no such simulated machine " + args.NodeID)
	}
	s.sleep(ctx)
	if len(c.Kind) > 4 && c.Kind[:4] == "bmc." && s.chance(s.faults().BMCErrorRate) {
		return failed("simulated BMC error: NodeBusy")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	powerWord := func() string {
		if m.power {
			return "on"
		}
		return "off"
	}
	switch c.Kind {
	case "bmc.query":
		if args.Query == "inventory" {
			macs := m.MACs
			if m.NoOOBMACs {
				macs = []string{}
			}
			return ok(map[string]any{"systemUuid": m.UUID, "macs": macs, "power": powerWord()})
		}
		if args.Query == "firmware" {
			return ok(map[string]any{"firmware": m.firmware()})
		}
		if args.Query == "bios" {
			res := bmc.BIOSReadResult{Attributes: map[string]string{}}
			for _, name := range args.Names {
				if v, ok := m.bios()[name]; ok {
					res.Attributes[name] = v
				}
			}
			return ok(res)
		}
		return ok(map[string]any{"power": powerWord()})
	case "bmc.bios":
		// As the Redfish driver: every attribute must exist; only the differing ones are
		// written, pending until the next power-on.
		res := bmc.BIOSWriteResult{Changed: []string{}}
		for _, name := range slices.Sorted(maps.Keys(args.Attributes)) {
			v, ok := m.bios()[name]
			if !ok {
				return failed("writing BIOS settings: the BMC does not report attribute " + name)
			}
			if v != args.Attributes[name] {
				res.Changed = append(res.Changed, name)
			}
		}
		if len(res.Changed) > 0 {
			if m.biosPending == nil {
				m.biosPending = map[string]string{}
			}
			for _, name := range res.Changed {
				m.biosPending[name] = args.Attributes[name]
			}
			res.Pending = true
			m.BIOSWrites++
		}
		return ok(res)
	case "bmc.firmware":
		// As the site agent: the components that run another version are installed, pending
		// until the next power-on.
		res := bmc.FirmwareUpdateResult{Updated: []string{}}
		for _, u := range args.Updates {
			if f, found := bmc.FindFirmware(m.firmware(), u.Component); found && f.Version == u.Version {
				continue
			}
			if len(u.SHA256) != 64 || u.URL == "" {
				return failed("arguments: the firmware image of " + u.Component + " needs url and sha256")
			}
			if m.FirmwareUpdateFails {
				return failed("installing " + u.Image + " on " + u.Component + ": the BMC's update task ended in Exception: simulated flash failure")
			}
			if m.fwPending == nil {
				m.fwPending = map[string]string{}
			}
			m.fwPending[u.Component] = u.Version
			m.FirmwareUpdates++
			res.Updated = append(res.Updated, u.Component)
		}
		slices.Sort(res.Updated)
		res.Pending = len(res.Updated) > 0
		return ok(res)
	case "bmc.boot":
		m.bootDev = args.Device
		return ok(map[string]any{"device": args.Device})
	case "bmc.power":
		switch args.Action {
		case "off":
			s.powerOff(m)
		case "on":
			if !m.power {
				s.powerOn(ctx, m)
			}
		case "cycle", "reset":
			s.powerOff(m)
			s.powerOn(ctx, m)
		}
		return ok(map[string]any{"power": powerWord()})
	case "boot.prepareRamdisk":
		if len(args.MACs) == 0 {
			return failed("arguments: macs is empty: the node has no known MAC") // as the site agent
		}
		m.entry, m.token = true, args.Token
		if m.Discovering && m.power && m.ramdisk == nil {
			// The waiting discovery-mode ramdisk learns its decision: it joins as the node.
			m.Discovering = false
			s.powerOn(ctx, m)
		}
		return ok(map[string]any{})
	case "boot.prepareInstance":
		m.instanceToken = args.Token
		return ok(map[string]any{})
	case "boot.cleanUp":
		m.entry = false
		return ok(map[string]any{})
	case "bmc.rotate":
		return s.rotate(c)
	case "bmc.media":
		switch args.Action {
		case "insert":
			if args.URL == "" || len(args.SHA256) != 64 {
				return failed("arguments: the iso needs url and sha256")
			}
			m.Media = args.URL
		case "eject":
			m.Media = ""
		default:
			return failed("arguments: action " + args.Action + ": accepted are insert, eject")
		}
		if m.NoVirtualMedia {
			return ok(map[string]any{"via": "sanboot", "image": args.Image})
		}
		return ok(map[string]any{"via": "virtualMedia", "image": args.Image})
	}
	return failed("the simulated site agent does not run " + c.Kind)
}

// powerOff stops whatever runs on the machine. Called with m.mu held.
func (s *Sim) powerOff(m *Machine) {
	m.power = false
	if m.ramdisk != nil {
		m.ramdisk()
		m.ramdisk = nil
	}
	if m.osLink != nil {
		m.osLink()
		m.osLink = nil
	}
	if m.osUp {
		m.osUp = false
		if s.link != nil { // in-process agents; over the gateway the stream's end says it
			s.link.Disconnected(context.Background(), engine.Agent{ID: engine.NodeAgentID("os", m.NodeID), Kind: "os", NodeID: m.NodeID})
		}
	}
}

// powerOn boots what the boot device and entries say. Called with m.mu held.
func (s *Sim) powerOn(ctx context.Context, m *Machine) {
	m.power = true
	if !m.IgnoreBIOSSettings {
		maps.Copy(m.bios(), m.biosPending)
	}
	m.biosPending = nil
	for comp, version := range m.fwPending {
		if m.FirmwareUpdateIgnored {
			break
		}
		fw := m.firmware()
		if i := slices.IndexFunc(fw, func(f bmc.Firmware) bool { return strings.EqualFold(f.ID, comp) || strings.EqualFold(f.Name, comp) }); i >= 0 {
			fw[i].Version = version
		} else {
			m.Firmware = append(fw, bmc.Firmware{ID: comp, Name: comp, Version: version})
		}
	}
	m.fwPending = nil
	switch {
	case m.bootDev == "pxe" && m.entry && m.token != "":
		rctx, cancel := context.WithCancel(ctx)
		m.ramdisk = cancel
		token := m.token
		m.token = "" // one-time
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.startRamdisk(rctx, m, token)
		}()
	case m.bootDev == "pxe" && !m.entry && len(m.MACs) > 0:
		// No boot entry: the site agent serves a script that waits, and reports the machine.
		s.discovered(ctx, m)
	case m.bootDev == "disk" && m.Disk == "image" && (m.instanceToken != "" || m.osGeneration != 0):
		token := m.instanceToken
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.startOS(ctx, m, token)
		}()
	}
}

// discovered reports m's first NIC PXE-booting with no entry, with the UUID iPXE reports, as
// the site agent does. Called with m.mu held.
func (s *Sim) discovered(ctx context.Context, m *Machine) {
	uuid := m.PXEUUID
	if uuid == "" {
		uuid = m.UUID
	}
	now := time.Now()
	d := agentlink.Discovered{MAC: m.MACs[0], UUID: uuid, Arch: "x86_64", FirstSeen: now, LastSeen: now}
	s.mu.Lock()
	if s.seen == nil {
		s.seen = map[string]agentlink.Discovered{}
	}
	if old, ok := s.seen[d.MAC]; ok {
		d.FirstSeen = old.FirstSeen
	}
	s.seen[d.MAC] = d
	all := make([]agentlink.Discovered, 0, len(s.seen))
	for _, v := range s.seen {
		all = append(all, v)
	}
	a, status := s.siteAgent, s.siteStatus
	s.mu.Unlock()
	if status != nil {
		status(all)
		return
	}
	err := s.link.RecordDiscovered(ctx, a, []engine.Discovery{{MAC: d.MAC, UUID: d.UUID, Arch: d.Arch, FirstSeen: d.FirstSeen, LastSeen: d.LastSeen}})
	if err != nil && ctx.Err() == nil {
		s.fail(fmt.Errorf("reporting discovered %s: %w", d.MAC, err))
	}
}

func (s *Sim) startOS(ctx context.Context, m *Machine, token string) {
	if s.cfg.Gateway != nil {
		s.osOverGateway(ctx, m, token)
		return
	}
	s.bootOS(ctx, m, token)
}

func (s *Sim) startRamdisk(ctx context.Context, m *Machine, token string) {
	if s.cfg.Gateway != nil {
		s.ramdiskOverGateway(ctx, m, token)
		return
	}
	s.runRamdisk(ctx, m, token)
}

func (s *Sim) bootOS(ctx context.Context, m *Machine, token string) {
	s.sleep(ctx)
	m.mu.Lock()
	gen := m.osGeneration
	if gen != 0 && token != "" && token != m.osToken {
		gen = 0 // the kept certificate is of a revoked generation: join again
	}
	m.mu.Unlock()
	nodeID := m.NodeID
	if gen == 0 {
		_, csr, err := s.keyAndCSR(ctx, "os-"+m.NodeID)
		if err != nil {
			if ctx.Err() == nil {
				s.fail(err)
			}
			return
		}
		if _, nodeID, gen, err = s.link.JoinNode(ctx, token, csr, "os"); err != nil {
			if ctx.Err() == nil {
				s.fail(fmt.Errorf("OS of %s joining: %w", m.NodeID, err))
			}
			return
		}
	}
	m.mu.Lock()
	if m.osGeneration != gen {
		m.osToken = token
	}
	m.osUp, m.osGeneration = true, gen
	m.mu.Unlock()
	if err := s.link.Connected(ctx, engine.Agent{ID: engine.NodeAgentID("os", nodeID), Kind: "os", NodeID: nodeID, Generation: gen}, "sim-os"); err != nil && ctx.Err() == nil {
		s.fail(err)
	}
}

func (s *Sim) runRamdisk(ctx context.Context, m *Machine, token string) {
	if s.cfg.BootDelay > 0 {
		t := time.NewTimer(s.cfg.BootDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	key, csr, err := s.keyAndCSR(ctx, "ramdisk-"+m.NodeID)
	if err != nil {
		if ctx.Err() == nil {
			s.fail(err)
		}
		return
	}
	cert, nodeID, gen, err := s.link.JoinNode(ctx, token, csr, "node")
	if err != nil {
		if ctx.Err() == nil {
			s.fail(fmt.Errorf("ramdisk of %s joining: %w", m.NodeID, err))
		}
		return
	}
	// Named as the gateway names a ramdisk (engine/gateway.go): one agent of the node, whose
	// connection each boot opens anew, and whose certificate (its key made at this boot) tells
	// the engine a new boot from a reconnect. A late departure of the previous boot names its
	// own connection and does not mark this one gone.
	a := engine.Agent{ID: engine.NodeAgentID("node", nodeID), Kind: "node", NodeID: nodeID, Generation: gen,
		ConnID: fmt.Sprintf("sim-%d", s.conns.Add(1)), CertDER: cert}
	if err := s.link.Connected(ctx, a, "sim-ramdisk"); err != nil {
		if ctx.Err() == nil {
			s.fail(err)
		}
		return
	}
	defer s.link.Disconnected(context.Background(), a)
	ch, stop := s.link.Subscribe(a)
	defer stop()
	r := &ramdisk{s: s, m: m, key: key, cert: cert, gen: gen}
	s.serve(ctx, a, ch, 2*time.Second, r.run, &mortality{fate: s.ramdiskDeath, die: m.CrashRamdisk, deaths: &s.ramdiskDeaths})
}

type ramdisk struct {
	s    *Sim
	m    *Machine
	key  crypto.Signer
	cert []byte
	gen  uint64
}

func (r *ramdisk) signed(ctx context.Context, c store.Command, result any) engine.Update {
	u := ok(result)
	if r.s.faults().UnsignedWipe && c.Kind == "disk.wipe" {
		return u
	}
	var sig []byte
	var err error
	st := pki.Statement{CommandID: c.ID, NodeID: c.NodeID, Kind: c.Kind, Generation: c.Generation, ResultSHA256: pki.ResultDigest(u.Result)}
	// With a presignature made ahead if one is left; else from scratch, in the CPU gate.
	sig, err = pki.SignStatement(presigner{key: r.key, stock: &r.s.presigs}, st)
	if errors.Is(err, errNoPresignature) {
		if gerr := r.s.cpuBound(ctx, func() { sig, err = pki.SignStatement(r.key, st) }); gerr != nil {
			err = gerr
		}
	}
	if err != nil {
		return failed("signing: " + err.Error())
	}
	u.NodeSig, u.SignerCertDER = sig, r.cert
	return u
}

func (r *ramdisk) run(ctx context.Context, a engine.Agent, c store.Command) engine.Update {
	r.s.sleep(ctx)
	if c.Kind == "boot.kexec" && r.s.faults().KexecFail {
		return failed("kexec_file_load: operation not permitted")
	}
	if c.Kind == "boot.kexec" {
		// Self-terminating: report running, then the ramdisk is gone and the OS boots.
		r.s.link.Report(context.WithoutCancel(ctx), a, engine.Update{CommandID: c.ID, State: "running"})
		r.s.kexec(ctx, r.m)
		return engine.Update{}
	}
	if c.Kind == "ramdisk.powerOff" {
		// The result first, then the host goes down (as the real ramdisk after its delay).
		u := ok(map[string]any{"poweringOff": true})
		u.CommandID = c.ID
		if err := r.s.link.Report(context.WithoutCancel(ctx), a, u); err != nil && ctx.Err() == nil {
			r.s.fail(fmt.Errorf("%s reporting %s: %w", a.ID, c.ID, err))
		}
		r.s.selfPowerOff(r.m)
		return engine.Update{}
	}
	result, attested, err := r.s.ramdiskWork(r.m, c.Kind)
	if err != nil {
		return failed(err.Error())
	}
	if attested {
		return r.signed(ctx, c, result)
	}
	return ok(result)
}

// SetHardware changes what the machine's ramdisk reports of it from its next inventory on (a
// DIMM lost, a disk replaced).
func (m *Machine) SetHardware(hw inventory.Inventory) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.Hardware = &hw
}

// SimHardware is a simulated machine's hardware unless it says otherwise (Machine.Hardware): one
// socket, 8 cores, 32 GiB, a 480 GB SATA SSD, a 25 Gbit/s link, booted by UEFI.
func SimHardware() inventory.Inventory {
	return inventory.Inventory{
		CPU:      inventory.CPU{Model: "Simulated CPU", Sockets: 1, Cores: 8, Threads: 16, Flags: []string{"avx2"}},
		Memory:   inventory.Memory{TotalBytes: 32 << 30},
		Disks:    []inventory.Disk{{Name: "sda", Path: "/dev/sda", Model: "SIM SSD", SizeBytes: 480e9, LogicalBlockSize: 512, PhysicalBlockSize: 4096, Transport: inventory.TransportSATA}},
		DMI:      inventory.DMI{SysVendor: "bcd", ProductName: "Simulated Machine"},
		BootMode: inventory.BootUEFI,
	}
}

// inventoryReport is inventory.refresh's result as a ramdisk writes it (the agent's
// InventoryResult): the identity the engine checks first, then the machine's hardware, its
// NICs those of its MACs.
func inventoryReport(m *Machine) any {
	hw := SimHardware()
	m.mu.Lock()
	if m.Hardware != nil {
		hw = *m.Hardware
	}
	m.mu.Unlock()
	hw.DMI.ProductUUID = m.UUID
	hw.NICs = make([]inventory.NIC, len(m.MACs))
	for i, mac := range m.MACs {
		hw.NICs[i] = inventory.NIC{Name: fmt.Sprintf("eth%d", i), MAC: mac, Driver: "sim", SpeedMbps: 25000, Carrier: i == 0}
	}
	return struct {
		SystemUUID string   `json:"systemUuid"`
		MACs       []string `json:"macs"`
		inventory.Inventory
	}{m.UUID, m.MACs, hw}
}

// ramdiskWork does what a ramdisk command does to the simulated machine and returns its result
// and whether the kind is attested.
func (s *Sim) ramdiskWork(m *Machine, kind string) (any, bool, error) {
	switch kind {
	case "inventory.refresh":
		return inventoryReport(m), false, nil
	case "diag.dcgm":
		return map[string]any{"result": "not applicable", "reason": "no NVIDIA GPU"}, true, nil
	case "disk.wipe":
		verified := !s.chance(s.faults().WipeReadbackFail)
		m.mu.Lock()
		m.Disk, m.osGeneration = "wiped", 0
		m.mu.Unlock()
		if s.cfg.Gateway != nil {
			os.RemoveAll(filepath.Join(s.cfg.Gateway.DataDir, m.NodeID)) // the OS's identity was on the disk
		}
		return map[string]any{"disks": []map[string]any{{"device": "/dev/vda", "method": "blkzeroout", "verified": verified}}}, true, nil
	case "deploy.image":
		m.mu.Lock()
		m.Disk = "image"
		m.mu.Unlock()
		return map[string]any{"bytes": 1 << 30}, false, nil
	case "deploy.configDrive":
		m.mu.Lock()
		disk := m.Disk
		m.mu.Unlock()
		if disk != "image" {
			return nil, false, errors.New("the image has no partition table: a config drive needs one")
		}
		return map[string]any{"device": "/dev/vda", "table": "mbr", "partition": 2}, false, nil
	case "bmc.provisionInband":
		if m.InbandBMC == "" {
			return nil, false, errors.New("opening the host's IPMI interface: no /dev/ipmi0")
		}
		return map[string]any{"address": m.InbandBMC, "channel": 1, "userId": 3, "username": "bcd"}, false, nil
	}
	return nil, false, fmt.Errorf("the simulated ramdisk does not run %s", kind)
}

// selfPowerOff is a ramdisk powering its own host off (ramdisk.powerOff): no BMC involved.
func (s *Sim) selfPowerOff(m *Machine) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s.powerOff(m)
	s.selfOffs.Add(1)
}

// SelfPowerOffs counts the ramdisks that powered their host off (ramdisk.powerOff).
func (s *Sim) SelfPowerOffs() int { return int(s.selfOffs.Load()) }

// CrashRamdisk ends the machine's ramdisk while the machine stays on (a crash, a lost
// network): its agent disconnects.
func (m *Machine) CrashRamdisk() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ramdisk != nil {
		m.ramdisk()
		m.ramdisk = nil
	}
}

// Powered reports whether the machine is on.
func (m *Machine) Powered() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.power
}

// kexec ends the machine's ramdisk and boots its installed OS.
func (s *Sim) kexec(ctx context.Context, m *Machine) {
	m.mu.Lock()
	token := m.instanceToken
	if m.ramdisk != nil {
		m.ramdisk()
		m.ramdisk = nil
	}
	m.mu.Unlock()
	if token != "" {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.startOS(context.WithoutCancel(ctx), m, token)
		}()
	}
}

// rotate is the simulated BMC's credential change, reported as a site agent does: signed with
// the agent's key (in-process; over the gateway agentlink signs).
func (s *Sim) rotate(c store.Command) engine.Update {
	f := s.faults().Rotate
	if f == "fail" {
		return failed("rotating credential: the BMC refused the new password (PasswordPolicy)")
	}
	u := ok(map[string]any{"verified": f != "unverified"})
	if s.cfg.Gateway != nil || f == "unsigned" {
		return u
	}
	s.mu.Lock()
	key, cert := s.siteKey, s.siteCert
	s.mu.Unlock()
	if key == nil {
		return u
	}
	if f == "forged" {
		other, _, err := pki.NewKeyAndCSR("forger")
		if err != nil {
			return failed(err.Error())
		}
		key = other
	}
	sig, err := pki.SignStatement(key, pki.Statement{CommandID: c.ID, NodeID: c.NodeID, Kind: c.Kind, Generation: c.Generation, ResultSHA256: pki.ResultDigest(u.Result)})
	if err != nil {
		return failed("signing: " + err.Error())
	}
	u.NodeSig, u.SignerCertDER = sig, cert
	return u
}
