// Package engine moves nodes: the level-triggered reconciler (sharded by node through leased
// wake-up rows), the workflow engine that runs profiles step by step, and the command queue the
// agent gateway serves. Every decision is taken inside one store transaction per node, from the
// rows alone, so a crash at any point resumes where the rows say.
package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"bcd/internal/batch"
	"bcd/internal/cache"
	"bcd/internal/console"
	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// Config tunes the engine.
type Config struct {
	// Name names this server among those sharing the store (its id is Name and a random
	// suffix, new at every start: leases, agent connections, heartbeats); default "engine".
	Name string
	// Workers reconcile nodes concurrently (each node by one worker at a time).
	Workers int
	// Batch is how many wake-ups one claim takes.
	Batch int
	// Lease is how long a claimed node belongs to this replica.
	Lease time.Duration
	// Poll is the longest wait between claims when nothing nudged the engine.
	Poll time.Duration
	// AgentGrace is how long a disconnected agent may take to reconnect before its commands
	// are released (never acknowledged) or lost (acknowledged).
	AgentGrace time.Duration
	// AssignedRescan is how often a connection's claims look in the store for commands assigned
	// to its agent that it was not offered: a claim of the agent's previous connection on
	// another server may still assign some after the new connection's first claim looked.
	// Default 1s.
	AssignedRescan time.Duration
	// PeerTimeout is how long a server may go without recording that it is alive before the
	// other servers sharing its store (or its own successor, after a restart) end its agents'
	// connections; it records so every PeerTimeout/6. Default 30s.
	PeerTimeout time.Duration
	// Observer is told how long each finished command and workflow took, once the change is
	// committed (bcd server exports it as Prometheus histograms); nil: nobody.
	Observer Observer
	// Profiles are operator-defined deploy profiles, beside the built-in ones.
	Profiles []workflow.Profile
	// UnreachableAfter is how many consecutive failed power reads raise BMC_UNREACHABLE on a
	// node; default DefaultUnreachableAfter.
	UnreachableAfter int
	// Secrets opens secret:// references (BMC credentials), which are then sent to the site
	// agent only encrypted to its certificate.
	Secrets SecretOpener
	// AutoEnroll enrolls a machine a pool's autoAccept just accepted when the pool's policy says
	// autoAcceptInband (metal.Service.AutoEnrollInband); nil: acceptances are only recorded.
	AutoEnroll func(ctx context.Context, siteID, mac string, pool store.Pool) error
	// MACWindow is how long after its power cycle a MAC-less node's MAC may first be seen
	// (await.macCandidate); default MACWindow (10 minutes).
	MACWindow time.Duration
	// FastTrackWindow is how long a ramdisk lingers after commissioning, release or inspection
	// where the node's pool sets no fastTrackWindow; 0: off (powered off at once).
	FastTrackWindow time.Duration
	// SiteCertTTL, NodeCertTTL and OSCertTTL are the lifetimes of the certificates issued to
	// site agents, ramdisks and installed OSes at join; defaults 90, 7 and 90 days. A connected
	// agent renews its certificate once two thirds of it have passed (Renew), so these bound
	// how long an agent may stay away, not how long it may serve.
	SiteCertTTL, NodeCertTTL, OSCertTTL time.Duration
	// Watermarks is told the store's watermark after each heartbeat and at a clean stop, once
	// committed (bcd server keeps the last in its data dir, to tell a store restored from a
	// backup at its next start); nil: nobody.
	Watermarks func(store.Watermark)
	// ApprovalTimeout is how long a destructive batch may wait for its approvals before it is
	// rejected (its nodes return where their verb came from, or fail BATCH_REJECTED). Default
	// DefaultApprovalTimeout (7 days).
	ApprovalTimeout time.Duration
	// QueueTimeout is how long a step's command may wait for an agent to take it (a backlog at
	// the site, its agents restarting or gone) before the step fails; the step's own timeout
	// runs from when an agent takes the command. Default DefaultQueueTimeout (30 minutes).
	QueueTimeout time.Duration
	// HistoryRetention is how long ended workflows and their finished commands are kept (wipe
	// proofs are kept for ever); EventRetention, how long events are. 0: the defaults
	// (DefaultHistoryRetention, DefaultEventRetention); negative: kept for ever. At least
	// MinRetention.
	HistoryRetention, EventRetention time.Duration
	// RelayConsoles: the engine keeps a hub of the operators' console sessions open on this
	// server (Consoles), which site agents' console streams attach to (Gateway.AttachConsole);
	// false: none are relayed.
	RelayConsoles bool
}

// DefaultApprovalTimeout is Config.ApprovalTimeout's default.
const DefaultApprovalTimeout = batch.DefaultApprovalTimeout

// DefaultPeerTimeout is Config.PeerTimeout's default.
const DefaultPeerTimeout = 30 * time.Second

// Default certificate lifetimes (Config.SiteCertTTL, NodeCertTTL, OSCertTTL).
const (
	DefaultSiteCertTTL = 90 * 24 * time.Hour
	DefaultNodeCertTTL = 7 * 24 * time.Hour
	DefaultOSCertTTL   = 90 * 24 * time.Hour
)

// Observer is told what finished and how long it took: a command from queued to its final
// state (succeeded, failed, lost), and how long of that it waited for an agent (from queued to
// the agent's acknowledgement; negative when no agent acknowledged it); a workflow from its
// start to its end (succeeded, failed, aborted).
type Observer interface {
	CommandFinished(kind, state string, waited, took time.Duration)
	WorkflowFinished(profile, state string, took time.Duration)
}

// SecretOpener opens a sealed secret by reference.
type SecretOpener interface {
	OpenSecret(ctx context.Context, ref string) ([]byte, error)
}

// Check refuses settings the engine cannot work with, saying what is accepted. Zero values
// take the defaults and pass.
func (c Config) Check() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"site agent certificate lifetime", c.SiteCertTTL}, {"ramdisk certificate lifetime", c.NodeCertTTL}, {"installed OS certificate lifetime", c.OSCertTTL}} {
		if d.v < 0 || d.v > pki.MaxLeafTTL {
			return fmt.Errorf("%s %s: accepted is up to %s (0: the default)", d.name, d.v, pki.MaxLeafTTL)
		}
	}
	if c.QueueTimeout < 0 {
		return fmt.Errorf("queue timeout %s: accepted is a positive duration (0: the default, %s)", c.QueueTimeout, DefaultQueueTimeout)
	}
	if err := checkRetention("history retention", c.HistoryRetention); err != nil {
		return err
	}
	return checkRetention("event retention", c.EventRetention)
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = "engine"
	}
	if c.Workers <= 0 {
		// Many: on SQLite every worker's transaction is committed with the others pending
		// (one commit for the group), so the workers bound the group.
		c.Workers = 128
	}
	if c.Batch <= 0 {
		c.Batch = 256
	}
	if c.Lease <= 0 {
		c.Lease = 10 * time.Second
	}
	if c.Poll <= 0 {
		c.Poll = 250 * time.Millisecond
	}
	if c.AgentGrace <= 0 {
		c.AgentGrace = 15 * time.Second
	}
	if c.PeerTimeout <= 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	if c.AssignedRescan <= 0 {
		c.AssignedRescan = time.Second
	}
	if c.MACWindow <= 0 {
		c.MACWindow = MACWindow
	}
	if c.ApprovalTimeout <= 0 {
		c.ApprovalTimeout = DefaultApprovalTimeout
	}
	defd := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defd(&c.SiteCertTTL, DefaultSiteCertTTL)
	defd(&c.NodeCertTTL, DefaultNodeCertTTL)
	defd(&c.OSCertTTL, DefaultOSCertTTL)
	defd(&c.QueueTimeout, DefaultQueueTimeout)
	if c.HistoryRetention == 0 {
		c.HistoryRetention = DefaultHistoryRetention
	}
	if c.EventRetention == 0 {
		c.EventRetention = DefaultEventRetention
	}
	return c
}

// Engine runs the reconciler and serves the command queue.
type Engine struct {
	cfg   Config
	st    *store.Store
	ca    *pki.CA
	log   *slog.Logger
	owner string
	// consoles: the operators' console sessions open on this server (nil: none relayed).
	consoles *console.Hub
	nudge    chan struct{}
	subs     *subscribers
	// cpu admits the CPU-heavy work done for agents beside the writer (cpuGate).
	cpu *cpuGate
	// sent holds, per connected agent, the commands offered on its current connection: a
	// command is offered at most once per connection (a reconnect offers the assigned but
	// unacknowledged ones again). It is keyed by agent and remembers the connection, so that
	// a claim or a departure of a replaced connection cannot touch its successor's set.
	sentMu sync.Mutex
	sent   map[string]*offered
	// cancels holds, per agent this server serves, the commands it is to cancel (given up
	// while it held them): what the store lists (cancel_durable.go), and what this server
	// gave up before the store was read again.
	cancels *cancelBook
	// osConns marks gateway connections whose node agent is the installed OS.
	osConns map[string]bool
	// acceptIngested makes attested results count without signature checks. Only tests set it
	// (AcceptIngestedAttestationForTests); no configuration reaches it.
	acceptIngested bool
	// afterPreRead runs in Report between its read of the command before the writer
	// (PostgreSQL) and its transaction. Only tests in this package set it: what another
	// server may change meanwhile.
	afterPreRead func()
	// steps keeps decoded step lists by their JSON: thousands of workflows of the same profile
	// carry the same few lists, decoded once instead of at every decision. Entries are read-only.
	steps *cache.Bounded[string, []workflow.Step]
	// startables keeps the profiles workflows started with, resolved (run.resolveWorkflow).
	startables *cache.Bounded[string, startable]
	// chains keeps the command kinds of the rest of a chain (Engine.chainKinds).
	chains *cache.Bounded[string, []string]
	// running holds batches read as running, a state no batch leaves, so that the steps of a
	// workflow under one do not each read it again.
	running *cache.Bounded[string, bool]
	// lost counts the commands that became lost since the engine started (CommandsLost).
	lost atomic.Int64
	// reconciled counts the node reconciliations this engine ran (Reconciliations).
	reconciled atomic.Int64
	// outbox holds the notices the other servers sharing a PostgreSQL store are to hear
	// (tellOthers).
	outbox chan notice
	// aliveSince is the first heartbeat of this server's current run of recorded heartbeats (0:
	// none, or the last failed), lastBeat the last one recorded (Heartbeat); store microseconds.
	beatMu               sync.Mutex
	aliveSince, lastBeat int64
	// clockWarned is the clock offset last reported as off (0: none reported).
	clockWarned time.Duration
	// dbOffset is the database clock's offset this server last measured and set (PostgreSQL),
	// if dbMeasured: a jump of it between heartbeats is a step of the database's clock.
	dbOffset   time.Duration
	dbMeasured bool
	// withheldSeen: the withheld boot-script episodes already recorded (RecordWithheld).
	withheldSeen *cache.Bounded[string, bool]
	// bootServices: what this server last wrote of each site agent's boot services (by agent
	// id) and artifact cache (by "cache|" and the id).
	bootServices *cache.Bounded[string, string]
	// unknownSeen: the commands unknown to the store that agents named, already recorded
	// (noteUnknown).
	unknownSeen *cache.Bounded[string, bool]
	// attestedKinds: the kinds of the attested commands this server handed to node agents, by
	// id, until their outcome: on SQLite, Report checks an outcome's signature from them before
	// the writer, without reading the command's row (preverifyClaimed).
	attestedKinds *cache.Bounded[string, string]
	// joinTokens: whom the node join tokens this server handed out in claims name, by the
	// token's hash, until used: JoinNode signs the certificate before the writer from them
	// without reading the token's row beside the writer.
	joinTokens *cache.Bounded[string, tokenNode]
	// credentials: BMC credentials encrypted to an agent (JWE), by the agent's certificate and
	// an HMAC of the plaintext under credentialsKey (a key of this process): a site agent's
	// claims carry the same node's credentials in command after command, and encrypting them
	// (an ephemeral ECDH each) took 1.7 s of the 64 s of CPU of a 1 000-node `bcd sim --gateway`
	// (server and agents). The secrets are still opened at every claim (a secret deleted since
	// is refused as before).
	credentials    *cache.Bounded[string, string]
	credentialsKey []byte
	// mark is the store's watermark at this server's last beat (Watermark); restored, once
	// set, what an agent showed of the store's restore (Witness): no command is sent.
	mark     atomic.Pointer[store.Watermark]
	restored atomic.Pointer[store.RestoreWitness]
	// witnessWarned is when a heartbeat last said that no command is sent (unix ns).
	witnessWarned atomic.Int64
	// failing: failed reconciliations' counters and log limiter (reconcileFailed).
	failing failingNodes
}

// ID is this server's id among those sharing the store (new at every start).
func (e *Engine) ID() string { return e.owner }

// CommandsLost counts the commands this engine recorded as lost since it started: acknowledged
// by an agent that went away, or reported interrupted by an agent's restart. Each is never
// sent again, and its step decides (DESIGN §5).
func (e *Engine) CommandsLost() int64 { return e.lost.Load() }

// Reconciliations counts the node reconciliations this engine ran since it started: by its
// workers, and inside the transactions of reports and agent arrivals. Servers sharing a store
// split the work between them; one whose count stands still does none.
func (e *Engine) Reconciliations() int64 { return e.reconciled.Load() }

// maxCachedSteps bounds the decoded step lists kept (operator profiles with per-node
// arguments differ per node); maxRunningBatches the running batches remembered.
const (
	maxCachedSteps    = 512
	maxRunningBatches = 16384
)

// New builds an engine over st. ca verifies attested results. A nil log discards.
func New(st *store.Store, ca *pki.CA, log *slog.Logger, cfg Config) *Engine {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	b := make([]byte, 6)
	rand.Read(b)
	credentialsKey := make([]byte, 32)
	rand.Read(credentialsKey)
	cfg = cfg.withDefaults()
	owner := cfg.Name + "-" + hex.EncodeToString(b)
	var consoles *console.Hub
	if cfg.RelayConsoles {
		consoles = console.NewHub(owner)
	}
	return &Engine{cfg: cfg, st: st, ca: ca, log: log, owner: owner, consoles: consoles,
		nudge: make(chan struct{}, 1), subs: newSubscribers(), sent: map[string]*offered{}, cancels: newCancelBook(), osConns: map[string]bool{}, outbox: make(chan notice, 4096),
		steps: cache.New[string, []workflow.Step](maxCachedSteps), running: cache.New[string, bool](maxRunningBatches),
		withheldSeen: cache.New[string, bool](maxWithheldSeen), bootServices: cache.New[string, string](maxBootServices),
		unknownSeen: cache.New[string, bool](maxUnknownSeen), attestedKinds: cache.New[string, string](maxAttestedKinds),
		joinTokens: cache.New[string, tokenNode](maxJoinTokens), startables: cache.New[string, startable](maxStartables),
		chains: cache.New[string, []string](maxChainKinds), credentials: cache.New[string, string](maxCredentials), credentialsKey: credentialsKey,
		cpu: newCPUGate(0)}
}

// Consoles is the hub of the console sessions open on this server (nil: none are relayed).
func (e *Engine) Consoles() *console.Hub { return e.consoles }

// Nudge asks the reconciler to look for due work now (a verb just queued a wake-up).
func (e *Engine) Nudge() {
	select {
	case e.nudge <- struct{}{}:
	default:
	}
}

// Run reconciles until ctx ends, then hands over what this server held (leave).
func (e *Engine) Run(ctx context.Context) error {
	defer e.leave(ctx)
	work := make(chan store.Lease)
	var wg sync.WaitGroup
	for range e.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := range work {
				_ = e.reconcile(ctx, l) // it logs its failures (reconcileFailed)
			}
		}()
	}
	defer func() { close(work); wg.Wait() }()
	if e.st.Engine() == store.Postgres {
		// Other servers may share the store: tell them, and hear from them, which agents
		// have new work.
		peers, stop := context.WithCancel(ctx)
		defer stop()
		wg.Go(func() { e.tellOthers(peers) })
		wg.Go(func() { e.hearOthers(peers) })
	}
	if err := e.Heartbeat(ctx); err != nil && ctx.Err() == nil {
		e.log.Error("recording that this server is alive", "error", err)
	}
	beat := time.NewTicker(e.cfg.PeerTimeout / 6)
	defer beat.Stop()
	reap := time.NewTicker(e.cfg.AgentGrace / 3)
	defer reap.Stop()
	sweep := time.NewTicker(30 * time.Second)
	defer sweep.Stop()
	for {
		leases, err := e.st.ClaimWakeUps(ctx, e.owner, e.cfg.Lease, e.cfg.Batch)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			e.log.Error("claiming wake-ups", "error", err)
		}
		for _, l := range leases {
			select {
			case work <- l:
			case <-ctx.Done():
				return nil
			}
		}
		if len(leases) == e.cfg.Batch {
			continue // more is due
		}
		select {
		case <-ctx.Done():
			return nil
		case <-e.nudge:
		case <-beat.C:
			if err := e.Heartbeat(ctx); err != nil && ctx.Err() == nil {
				e.log.Error("recording that this server is alive", "error", err)
			}
		case <-reap.C:
			if err := e.reapAgents(ctx); err != nil && ctx.Err() == nil {
				e.log.Error("releasing commands of departed agents", "error", err)
			}
		case <-sweep.C:
			if _, err := e.Sweep(ctx); err != nil && ctx.Err() == nil {
				e.log.Error("sweeping for stranded nodes", "error", err)
			}
		case <-time.After(e.cfg.Poll):
		}
	}
}

// leave hands over, on a clean stop, what this server holds: its agents' connections end now,
// and the nodes it leased are due at once for the other servers sharing the store.
func (e *Engine) leave(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var mark store.Watermark
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		if err := tx.ServerLeaving(ctx, e.owner); err != nil {
			return err
		}
		var err error
		mark, err = tx.Beat(ctx)
		return err
	})
	if err != nil {
		e.log.Warn("handing over at stop; the other servers take over when this one's leases and heartbeat expire", "error", err)
		return
	}
	e.watermark(mark)
}

// RunOnce claims and reconciles every due node once (tests, tools). It returns how many.
func (e *Engine) RunOnce(ctx context.Context) (int, error) {
	leases, err := e.st.ClaimWakeUps(ctx, e.owner, e.cfg.Lease, 10000)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, l := range leases {
		errs = append(errs, e.reconcile(ctx, l))
	}
	return len(leases), errors.Join(errs...)
}

// reconcile applies every decision the node's rows call for, in one transaction, then ends the
// lease (due again at the nearest deadline, if something waits). An error rolls the node's
// changes back; reconcileFailed counts it, retries the node with a back-off and raises
// RECONCILE_FAILED on one that keeps failing.
func (e *Engine) reconcile(ctx context.Context, l store.Lease) error {
	var fx effects
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		r := &run{e: e, tx: tx, ctx: ctx}
		again, err := r.node(l.NodeID)
		if err == nil {
			err = r.clearReconcileFault()
		}
		if err == nil && e.failing.inject != nil {
			err = e.failing.inject(l.NodeID)
		}
		if err != nil {
			return err
		}
		fx = r.effects()
		return tx.FinishWakeUp(ctx, l, e.owner, again)
	})
	if err != nil {
		return e.reconcileFailed(ctx, l, fmt.Errorf("reconciling %s: %w", l.NodeID, err))
	}
	e.reconciled.Add(1)
	e.after(fx)
	return nil
}

// joinTokenKeep is how long a join token is kept once used or expired (Sweep deletes it then).
const joinTokenKeep = 7 * 24 * time.Hour

// Sweep wakes nodes a workflow chain controls that nothing would move (no open workflow, no
// wake-up row): a node never stays in a workflow-driven state without a workflow. It also
// deletes superseded BMC secrets, join tokens spent or expired over joinTokenKeep ago, and
// history past its retention (PurgeHistory).
func (e *Engine) Sweep(ctx context.Context) (int, error) {
	if err := e.st.Write(ctx, func(tx *store.Tx) error {
		n, err := PurgeSupersededSecrets(ctx, tx, 1000)
		if n > 0 {
			e.log.Info("deleted superseded BMC secrets", "count", n)
		}
		if err != nil {
			return err
		}
		n, err = tx.PurgeJoinTokens(ctx, tx.At()-joinTokenKeep.Microseconds(), 1000)
		if err != nil {
			return err
		}
		if n > 0 {
			e.log.Debug("deleted spent join tokens", "count", n, "older_than", joinTokenKeep)
		}
		if _, err = tx.PurgeDHCPLeases(ctx, tx.At(), 1000); err != nil {
			return err
		}
		return e.withdrawOrphanConsoles(ctx, tx)
	}); err != nil {
		return 0, err
	}
	if _, err := e.ExpireBatches(ctx); err != nil {
		return 0, err
	}
	if _, err := e.PurgeHistory(ctx); err != nil {
		return 0, err
	}
	nodes, err := e.st.StrandedNodes(ctx, 1000)
	if err != nil || len(nodes) == 0 {
		return 0, err
	}
	err = e.st.Write(ctx, func(tx *store.Tx) error {
		for _, n := range nodes {
			if err := tx.Wake(ctx, n.ID, "sweep: no workflow and no wake-up", 0); err != nil {
				return err
			}
		}
		return nil
	})
	e.log.Warn("woke stranded nodes", "count", len(nodes))
	e.Nudge()
	return len(nodes), err
}
