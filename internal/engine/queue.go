package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"bcd/internal/command"
	"bcd/internal/pki"
	"bcd/internal/store"
)

// Agent is a connected agent as the gateway identified it from its certificate.
type Agent struct {
	ID         string // site agents: their agent id; node agents: "node:<id>" or "os:<id>"
	Kind       string // "site", "node" (ramdisk) or "os" (the installed OS rejoining)
	SiteID     string
	NodeID     string
	Generation uint64
	// ConnID names the connection (Connected and Disconnected of one connection carry the same).
	ConnID string
	// CertDER is the agent's certificate: secrets it needs (BMC credentials) are encrypted to it.
	CertDER []byte
	// CAs is what the agent said of its CAs as it connected (nil: nothing), recorded with its
	// connection.
	CAs *store.AgentCAs
}

// Update is an agent's report on a command.
type Update struct {
	CommandID       string
	State           string // running, succeeded, failed
	ProgressDone    int64
	ProgressTotal   int64
	ProgressMessage string
	Result          []byte
	Error           string
	NodeSig         []byte
	SignerCertDER   []byte
}

// notice is a key agents subscribe to: "site:<id>" or "node:<id>".
type notice string

func (r *run) notify(c store.Command) { r.notices = append(r.notices, noticeFor(c)) }

// noticeFor is the notice that wakes the agents that may take c: its node's ramdisk, or its
// site's agents.
func noticeFor(c store.Command) notice {
	if c.RunsOn == string(command.OnRamdisk) {
		return notice("node:" + c.NodeID)
	}
	return notice("site:" + c.SiteID)
}

type subscribers struct {
	mu sync.Mutex
	m  map[notice]map[chan struct{}]bool
}

func newSubscribers() *subscribers { return &subscribers{m: map[notice]map[chan struct{}]bool{}} }

func (s *subscribers) signal(k notice) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.m[k] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// effects is what a transaction leaves to do once it has committed: wake the streams of agents
// that have new work, and tell the Observer what finished.
type effects struct {
	notices  []notice
	ended    []store.Command  // commands that reached a final state
	finished []store.Workflow // workflows that ended
	// cancelled are commands given up while an agent held them (abort, timeout): the agent
	// is told to cancel them.
	cancelled []store.Command
}

// after carries out fx, once its transaction has committed.
func (e *Engine) after(fx effects) {
	e.cancel(fx.cancelled)
	e.publish(fx.notices)
	o := e.cfg.Observer
	if o == nil {
		return
	}
	for _, c := range fx.ended {
		waited := time.Duration(-1)
		if c.DeliveredAt > 0 {
			waited = time.Duration(max(c.DeliveredAt-c.CreatedAt, 0)) * time.Microsecond
		}
		o.CommandFinished(c.Kind, c.State, waited, time.Duration(c.FinishedAt-c.CreatedAt)*time.Microsecond)
	}
	for _, wf := range fx.finished {
		o.WorkflowFinished(wf.Profile, wf.State, time.Duration(wf.FinishedAt-wf.CreatedAt)*time.Microsecond)
	}
}

// agentsChannel is the PostgreSQL channel on which servers sharing a store tell each other which
// agents may have new work, so that a command one server queues reaches an agent connected to
// another at once, not at that gateway's next poll.
const agentsChannel = "bcd_agent_work"

// publish signals this server's agent streams of notices, and queues them for the other servers
// sharing a PostgreSQL store.
func (e *Engine) publish(notices []notice) {
	for _, n := range notices {
		e.subs.signal(n)
	}
	if e.st.Engine() != store.Postgres {
		return
	}
	for _, n := range notices {
		select {
		case e.outbox <- n:
		default: // full: the other servers' gateways find the work at their next poll
		}
	}
}

// maxNoticesPerNotify bounds the notices tellOthers sends in one statement.
const maxNoticesPerNotify = 512

// tellOthers sends the notices publish queued to the other servers, all those waiting in one
// statement, each once, until ctx ends.
func (e *Engine) tellOthers(ctx context.Context) {
	for {
		var n notice
		select {
		case <-ctx.Done():
			return
		case n = <-e.outbox:
		}
		seen := map[notice]bool{n: true}
		payloads := []string{e.owner + " " + string(n)}
	more:
		for len(payloads) < maxNoticesPerNotify {
			select {
			case n = <-e.outbox:
				if !seen[n] {
					seen[n] = true
					payloads = append(payloads, e.owner+" "+string(n))
				}
			default:
				break more
			}
		}
		if err := e.st.Notify(ctx, agentsChannel, payloads...); err != nil && ctx.Err() == nil {
			e.log.Warn("telling the other servers which agents have new work; their gateways poll meanwhile", "error", err)
		}
	}
}

// hearOthers signals this server's agent streams of the notices the other servers send, and
// reads the cancels their notices announce for this server's agents (heardCancel), until ctx
// ends, listening again a second after its connection fails.
func (e *Engine) hearOthers(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { e.refreshOnNotice(ctx) })
	for ctx.Err() == nil {
		err := e.st.Listen(ctx, agentsChannel, func(p string) {
			if owner, n, ok := strings.Cut(p, " "); ok && owner != e.owner && !e.heardCancel(n) {
				e.subs.signal(notice(n))
			}
		})
		if ctx.Err() != nil {
			return
		}
		e.log.Warn("listening for the other servers' notices; this server's gateway polls meanwhile", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// Subscribe returns a channel signalled when new work may exist for a, and a function ending
// the subscription. Work queued by another server sharing the store is signalled through
// hearOthers; the gateway also polls.
func (e *Engine) Subscribe(a Agent) (<-chan struct{}, func()) {
	k := notice("site:" + a.SiteID)
	if a.Kind != "site" {
		k = notice("node:" + a.NodeID)
	}
	ch := make(chan struct{}, 1)
	e.subs.mu.Lock()
	if e.subs.m[k] == nil {
		e.subs.m[k] = map[chan struct{}]bool{}
	}
	e.subs.m[k][ch] = true
	e.subs.mu.Unlock()
	return ch, func() {
		e.subs.mu.Lock()
		delete(e.subs.m[k], ch)
		if len(e.subs.m[k]) == 0 {
			delete(e.subs.m, k)
		}
		e.subs.mu.Unlock()
	}
}

// Connected records an agent's connection. A node agent's arrival wakes its node (a step may be
// waiting for it). A ramdisk connecting with another key than its node's ramdisk last did is
// another boot of the machine: the commands the previous boot acknowledged are lost at once
// (previousBoot). The agent's pending cancels are read once the connection is recorded.
func (e *Engine) Connected(ctx context.Context, a Agent, version string) error {
	e.sentMu.Lock()
	e.sent[a.ID] = &offered{conn: a.ConnID, ids: map[string]bool{}}
	e.sentMu.Unlock()
	renewAt, notAfter, key := connectedCert(a.CertDER)
	var fx effects
	var lost []store.Command
	woken := false
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		fx, lost, woken = effects{}, nil, false
		if err := tx.UpsertAgent(ctx, store.Agent{ID: a.ID, Kind: a.Kind, SiteID: a.SiteID, NodeID: a.NodeID, Generation: a.Generation,
			ConnID: a.ConnID, Version: version, ServerID: e.owner, CertRenewAt: renewAt, CertNotAfter: notAfter, CAs: a.CAs}); err != nil {
			return err
		}
		if a.NodeID == "" {
			return nil
		}
		var locked *lockedNode
		var err error
		if lost, locked, err = previousBoot(ctx, tx, a, key); err != nil {
			return err
		}
		fx, woken, err = e.wakeOrReconcile(ctx, tx, a.NodeID, locked, a.Kind+" agent connected", lost...)
		return err
	})
	if err == nil {
		e.lost.Add(int64(len(lost)))
		fx.ended = append(fx.ended, lost...)
		e.after(fx)
		if len(lost) > 0 {
			e.log.LogAttrs(ctx, slog.LevelWarn, "a new boot of a node's ramdisk connected: the commands the previous boot acknowledged are lost (never sent twice)",
				slog.String("node", a.NodeID), slog.Int("commands", len(lost)))
		}
		e.loadCancels(ctx, a)
	}
	if woken {
		e.Nudge()
	}
	return err
}

// previousBoot ends, as ramdisk agent a connects with the key whose SHA-256 is key, the
// commands a previous boot of the node's ramdisk acknowledged, if a's key is not the one the
// node's ramdisk last connected with (store.Tx.NodeAgentBoot): a ramdisk makes its key in RAM
// at every boot (a reconnect, or a renewed certificate, keeps it), so the machine was reset
// and that boot is gone with its journal. Such a command can never finish, and an
// acknowledged command is never sent again (DESIGN §5): it is lost now, and its step decides
// (query, retry or fail) instead of waiting for the command's deadline, which the agent's grace
// period did not end because the node's ramdisk (one agent id) came back within it. What the
// previous boot was offered and never acknowledged stays queued for the new one: it never
// ran. A site agent resumes its journal across reconnects and restarts, and an installed OS
// runs nothing: only ramdisks. Returns the commands lost, and the node as it locked and read it
// (nil: it did not), for the reconciliation that follows in tx: what it writes (commands)
// changes neither the node's row, nor its wake-up, nor its workflows.
func previousBoot(ctx context.Context, tx *store.Tx, a Agent, key string) ([]store.Command, *lockedNode, error) {
	if a.Kind != "node" || key == "" {
		return nil, nil, nil // in-process agents have no certificate
	}
	rebooted, err := tx.NodeAgentBoot(ctx, a.ID, key)
	if err != nil || !rebooted {
		return nil, nil, err
	}
	// The node before its commands, as reports and the reconciler lock them (PostgreSQL):
	// the old boot's last report may be on its way through another server.
	var locked *lockedNode
	ln, err := tx.LockNodeForReconcile(ctx, a.NodeID)
	switch {
	case err == nil:
		locked = &lockedNode{n: ln.Node, seq: ln.Seq, wf: &ln.Workflow, wfOpen: ln.Open}
	case !errors.Is(err, store.ErrNotFound):
		return nil, nil, err
	}
	lost, err := tx.LosePreviousBoot(ctx, a.ID, "the node's ramdisk booted again: the boot that acknowledged the command is gone; it is never sent twice")
	return lost, locked, err
}

// Disconnected records an agent's departure. Its commands are released or lost only after the
// grace period (a reconnect inside it resumes them): see reapAgents.
func (e *Engine) Disconnected(ctx context.Context, a Agent) error {
	e.sentMu.Lock()
	if o := e.sent[a.ID]; o == nil || o.conn == a.ConnID {
		// Not a successor's. Kept as departed, not deleted: a claim of this connection still
		// in flight must take nothing (Claim), and it is no live connection to reassert.
		e.sent[a.ID] = &offered{conn: a.ConnID, gone: true}
	}
	e.sentMu.Unlock()
	return e.st.Write(ctx, func(tx *store.Tx) error { return tx.AgentGone(ctx, a.ID, a.ConnID) })
}

// Seen refreshes an agent's liveness (heartbeats).
func (e *Engine) Seen(ctx context.Context, a Agent) error {
	return e.st.Write(ctx, func(tx *store.Tx) error { return tx.AgentSeen(ctx, a.ID, a.ConnID) })
}

// Heartbeat records that this server is alive (Run does so every PeerTimeout/6). The first
// heartbeat after one failed or came late records again this server's live agent connections
// that other servers ended meanwhile, taking its silence for death.
//
// The first heartbeat of this server's run (or its first after one failed) that finds the
// control plane silent for longer than PeerTimeout (no server was alive, or none could write:
// an upgrade, a crash, the store out) gives that time back to the
// steps in progress: agents went on working meanwhile and report once they reconnect, and a
// step whose deadline passed while nobody could hear them would otherwise fail its workflow
// (WORKFLOW_TIMEOUT, which is not retried), leaving the node failed in maintenance.
func (e *Engine) Heartbeat(ctx context.Context) error {
	e.sentMu.Lock()
	live := make(map[string]string, len(e.sent))
	for id, o := range e.sent {
		if !o.gone {
			live[id] = o.conn
		}
	}
	e.sentMu.Unlock()
	offset, measured := e.measureClock(ctx)
	// On SQLite the store's time runs on the monotonic clock between heartbeats: a step of the
	// wall clock reaches it only here (store.Reanchor, below), after the steps in progress were
	// given a forward step's time in the same write that records the heartbeat. On PostgreSQL
	// the database's clock rules: a step of it shows as a jump of its offset from this server's
	// monotonic clock, which the store's time takes only once the steps were given it
	// (store.SetClockOffset, below), and only one server gives it (Tx.ClaimClockStep).
	var drift, step, dbStep time.Duration
	if e.st.Engine() == store.SQLite {
		if drift = e.st.WallStep(); drift >= MinClockStep {
			step = drift
		}
	}
	e.beatMu.Lock()
	since, last := e.aliveSince, e.lastBeat
	if measured && e.dbMeasured && last != 0 && offset-e.dbOffset >= MinClockStep {
		dbStep = offset - e.dbOffset
	}
	e.beatMu.Unlock()
	if measured {
		e.warnClock(ctx, offset, dbStep > 0)
	}
	if measured && dbStep == 0 {
		e.setClockOffset(offset)
	}
	var at int64
	var outage time.Duration
	var extended, stepped int
	var mark store.Watermark
	fresh := false
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		at, outage, extended, stepped = tx.At(), 0, 0, 0
		fresh = since == 0 || at-last > e.cfg.PeerTimeout.Microseconds()/2
		if err := tx.ServerAlive(ctx, e.owner, offset); err != nil {
			return err
		}
		var err error
		if mark, err = tx.Beat(ctx); err != nil {
			return err
		}
		if err := tx.ExpireCancels(ctx, tx.At()-cancelKeep.Microseconds()); err != nil {
			return err
		}
		silence, err := tx.ControlPlaneAlive(ctx, e.cfg.PeerTimeout)
		if err != nil {
			return err
		}
		if step > 0 {
			if stepped, err = e.giveBack(ctx, tx, step, "control_plane.clock_step", "the clock stepped %s forward"); err != nil {
				return err
			}
		}
		if dbStep > 0 {
			claimed, err := tx.ClaimClockStep(ctx, last, dbStep)
			if err != nil {
				return err
			}
			if claimed {
				if stepped, err = e.giveBack(ctx, tx, dbStep, "control_plane.clock_step", "the database's clock stepped %s forward"); err != nil {
					return err
				}
			}
		}
		// Only a server that was not recording itself (just started, or cut off from the store)
		// takes a silence for an outage: a live server's heartbeat that comes late is this
		// server being slow, or a test moving the clock to run a step out of time.
		if since == 0 && silence > 0 {
			outage = silence
			if extended, err = e.giveBack(ctx, tx, outage, "control_plane.outage", "no server was alive for %s"); err != nil {
				return err
			}
		}
		if !fresh || last == 0 {
			return nil
		}
		for id, conn := range live {
			if err := tx.ReassertConnection(ctx, id, conn, e.owner, last); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		e.watermark(mark)
		e.checkWitnessed(ctx)
		// The cancels of this server's agents that another server gave up and whose notice
		// was missed (or never sent: the notices' queue full).
		if err := e.refreshCancels(ctx); err != nil && ctx.Err() == nil {
			e.log.LogAttrs(ctx, slog.LevelWarn, "reading the cancels of this server's agents", slog.Any("error", err))
		}
	}
	if err == nil && outage > 0 {
		e.log.LogAttrs(ctx, slog.LevelWarn, "the control plane was down: the steps in progress get that time back",
			slog.Duration("outage", outage.Round(time.Second)), slog.Int("workflows", extended))
	}
	if err == nil && drift.Abs() >= reanchorAt {
		e.st.Reanchor()
	}
	if err == nil && dbStep > 0 {
		e.setClockOffset(offset)
	}
	if err == nil && step > 0 {
		e.log.LogAttrs(ctx, slog.LevelWarn, "the clock stepped forward: the steps in progress get that time back (keep NTP slewing)",
			slog.Duration("step", step.Round(time.Second)), slog.Int("workflows", stepped))
	}
	if err == nil && dbStep > 0 {
		e.log.LogAttrs(ctx, slog.LevelWarn, "the database's clock stepped forward: the steps in progress get that time back (keep NTP slewing on the database's host)",
			slog.Duration("step", dbStep.Round(time.Second)), slog.Int("workflows", stepped))
	}
	e.beatMu.Lock()
	defer e.beatMu.Unlock()
	if err != nil {
		e.aliveSince = 0
		return err
	}
	if fresh {
		e.aliveSince = at
	}
	e.lastBeat = at
	return nil
}

// clockWarnAt is how far off the database's clock this server's may be before it says so.
const clockWarnAt = time.Second

// giveBack moves the deadlines of the steps in progress by d (Tx.ExtendStepDeadlines) and
// records an event of kind whose reason is why (a format of d) and how many workflows moved.
func (e *Engine) giveBack(ctx context.Context, tx *store.Tx, d time.Duration, kind, why string) (int, error) {
	n, err := tx.ExtendStepDeadlines(ctx, d)
	if err != nil {
		return 0, err
	}
	data, _ := json.Marshal(map[string]any{"seconds": int64(d.Seconds()), "workflows": n, "server": e.owner})
	return n, tx.AppendEvent(ctx, store.Event{Actor: "system", Kind: kind, Data: string(data),
		Reason: fmt.Sprintf(why, d.Round(time.Second)) + ": the steps in progress get that time back"})
}

// MinClockStep is the smallest step forward of the wall clock that the steps in progress are
// given back (SQLite): a smaller one, or a step back, only moves the store's time with it.
const MinClockStep = 5 * time.Second

// reanchorAt is the smallest difference between the wall clock and the store's that the
// heartbeat makes the store follow (SQLite): the two run at the same rate (NTP slews both), so
// below it there is nothing to follow, and the store's time never goes back by a hair.
const reanchorAt = 100 * time.Millisecond

// measureClock reads how far the database's clock is from this server's (Store.MeasureClock):
// the offset measured, or the one in use when measured is false (SQLite, an error).
func (e *Engine) measureClock(ctx context.Context) (off time.Duration, measured bool) {
	off, measured, err := e.st.MeasureClock(ctx)
	if err != nil {
		e.log.LogAttrs(ctx, slog.LevelWarn, "reading the database's clock", slog.Any("error", err))
	}
	return off, measured
}

// warnClock says when this server's clock is off the database's by clockWarnAt or more (off,
// measured), or no longer is; an offset that moved by a step of the database's clock is said
// by the step's own warning.
func (e *Engine) warnClock(ctx context.Context, off time.Duration, dbStepped bool) {
	e.beatMu.Lock()
	defer e.beatMu.Unlock()
	switch {
	case dbStepped:
		e.clockWarned = off
	case off.Abs() >= clockWarnAt && (e.clockWarned == 0 || (off-e.clockWarned).Abs() >= clockWarnAt):
		e.clockWarned = off
		e.log.LogAttrs(ctx, slog.LevelWarn, "this server's clock is off the database's: the server keeps the database's time (check its NTP)",
			slog.Duration("offset", off))
	case off.Abs() < clockWarnAt && e.clockWarned != 0:
		e.clockWarned = 0
		e.log.LogAttrs(ctx, slog.LevelInfo, "this server's clock agrees with the database's again", slog.Duration("offset", off))
	}
}

// setClockOffset makes off, measured by measureClock, the store's and this server's last.
func (e *Engine) setClockOffset(off time.Duration) {
	e.st.SetClockOffset(off)
	e.beatMu.Lock()
	e.dbOffset, e.dbMeasured = off, true
	e.beatMu.Unlock()
}

// judgesPeers says whether this server, at store time now, has been recording that it is alive
// for at least PeerTimeout without a gap: only then may it take another server's silence for
// death (after the store itself was out, every server is silent for a while).
func (e *Engine) judgesPeers(now int64) bool {
	e.beatMu.Lock()
	defer e.beatMu.Unlock()
	timeout := e.cfg.PeerTimeout.Microseconds()
	return e.aliveSince != 0 && now-e.aliveSince >= timeout && now-e.lastBeat <= timeout/2
}

// reapAgents ends the connections of servers that stopped showing they are alive, then applies
// the departure of agents gone longer than the grace period: commands they never acknowledged
// are released to another agent of the site (every site kind: such a command never ran);
// commands they acknowledged are lost: never sent twice. An agent connected again since the
// list was read (PostgreSQL) is left alone: what it acknowledged since is its new
// connection's (store.Tx.StillGoneSince).
func (e *Engine) reapAgents(ctx context.Context) error {
	var nodes []string
	var released []notice
	var lostCmds []store.Command
	lost, ended := 0, 0
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		nodes, released, lostCmds, lost, ended = nil, nil, nil, 0, 0
		if now := tx.At(); e.judgesPeers(now) {
			var err error
			if ended, err = tx.EndDeadServersConnections(ctx, e.owner, now-e.cfg.PeerTimeout.Microseconds()); err != nil {
				return err
			}
		}
		before := tx.At() - e.cfg.AgentGrace.Microseconds()
		gone, err := tx.AgentsGoneSince(ctx, before)
		if err != nil {
			return err
		}
		for _, id := range gone {
			// Back since it was listed (PostgreSQL: its new connection committed meanwhile, and
			// may have acknowledged a command): its departure is over. Locked from here, so
			// that it cannot connect again until this departure is applied.
			still, err := tx.StillGoneSince(ctx, id, before)
			if err != nil {
				return err
			}
			if !still {
				continue
			}
			applied, err := tx.ReleaseAgentCommands(ctx, id, func(c store.Command) (string, bool) {
				next, release := command.Lost, false
				if k, err := command.Lookup(c.Kind); err == nil {
					next, release = command.AgentGone(command.State(c.State), k)
				}
				return string(next), release
			})
			if err != nil {
				return err
			}
			// Only what was written: a command its agent acknowledged or reported on since it
			// was read (PostgreSQL) is left as the agent made it.
			for _, c := range applied {
				nodes = append(nodes, c.NodeID)
				switch {
				case c.State == string(command.Lost):
					lost++
					lostCmds = append(lostCmds, c)
				case c.TargetAgent == "":
					released = append(released, noticeFor(c))
				}
			}
			// A departed ramdisk leaves behind what was queued for it and never taken: its step
			// ends without waiting for its deadline (run.advance).
			waiting, err := tx.NodeWaitingForRamdisk(ctx, id)
			if err != nil {
				return err
			}
			if waiting != "" {
				nodes = append(nodes, waiting)
			}
			if err := tx.MarkAgentReaped(ctx, id); err != nil {
				return err
			}
		}
		slices.Sort(nodes)
		nodes = slices.Compact(nodes)
		for _, n := range nodes {
			if err := tx.Wake(ctx, n, "agent gone", 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		e.lost.Add(int64(lost))
		e.after(effects{notices: released, ended: lostCmds}) // the site's other agents take them now, not at their next poll
		if ended > 0 {
			e.log.Warn("ended the agent connections of servers silent longer than the peer timeout", "connections", ended, "peer_timeout", e.cfg.PeerTimeout)
		}
	}
	if len(nodes) > 0 {
		e.Nudge()
	}
	return err
}

// ErrNotYours is a report about a command assigned to another agent.
var ErrNotYours = errors.New("command is not assigned to this agent")

// ErrFinished is an acknowledgement of a command that has ended (cancelled, or declared lost
// while its agent was away): the agent must not run it.
var ErrFinished = errors.New("command has already ended")

// Claim returns up to limit commands for a to run: a site agent's are assigned to it, a node
// agent's are only offered (its acknowledgement assigns them: offer). Tokens that must reach
// only the agent (a boot entry's one-time discovery token) are minted here, stored as hashes,
// and never written to the command row.
func (e *Engine) Claim(ctx context.Context, a Agent, limit int) ([]store.Command, error) {
	if !e.sending() {
		return nil, nil // an agent showed the store was restored (Witness)
	}
	e.sentMu.Lock()
	o := e.sent[a.ID]
	sent := len(o.on(a.ConnID))
	departed := o.over(a.ConnID)
	// The commands already assigned to the agent are looked for at a connection's first claim
	// (what its previous connection took and never acknowledged) and then at most every
	// AssignedRescan: every claim on the connection since offered what it assigned, and
	// reading back what it offered and is not yet acknowledged cost a busy site agent's claims
	// a read of thousands of rows each.
	rescan := o.on(a.ConnID) == nil || time.Since(o.scanned) >= e.cfg.AssignedRescan
	looked := time.Now()
	e.sentMu.Unlock()
	if departed {
		return nil, nil // the connection ended or was replaced: what it would take goes to a dead stream
	}
	isOffered := func(id string) bool {
		e.sentMu.Lock()
		defer e.sentMu.Unlock()
		return e.sent[a.ID].on(a.ConnID)[id]
	}
	// The candidates are read outside the single writer (most claims find nothing new); the
	// writer only takes those still free or still this agent's.
	var cands []store.Command
	var err error
	read := func() {
		cands, err = e.st.CommandCandidates(ctx, a.ID, a.Kind, a.SiteID, a.NodeID, a.Generation, limit, rescan, isOffered, sent, holderKinds()...)
	}
	if e.st.Engine() == store.SQLite {
		// SQLite's read is this process's CPU (its page cache, its b-trees): through the gate,
		// a site agent's before the nodes' work waiting there (its claim moves hundreds of
		// machines; cpuGate).
		gated := e.cpu.run
		if a.Kind == "site" {
			gated = e.cpu.runFirst
		}
		if gerr := gated(ctx, read); gerr != nil {
			return nil, gerr
		}
	} else {
		// PostgreSQL's is a round trip, the database doing the work: a slot held across it
		// would keep every certificate and result check waiting on the network (measured:
		// the gate's mean wait 1.0–1.5 s at 2 000 nodes, site commands waiting 1.5–2.5 s).
		read()
	}
	if err != nil {
		return nil, err
	}
	if rescan {
		e.sentMu.Lock()
		if o := e.sent[a.ID]; o.on(a.ConnID) != nil {
			o.scanned = looked
		}
		e.sentMu.Unlock()
	}
	cands = slices.DeleteFunc(cands, func(c store.Command) bool { return isOffered(c.ID) || !e.relaysConsole(c) })
	if len(cands) == 0 {
		return nil, nil
	}
	creds := map[string]map[string]any{}
	// A command whose credentials cannot be opened (its secret gone) fails on its own: it
	// must not stand, oldest first, in front of every claim of the site.
	broken := map[string]string{}
	for _, c := range cands {
		cr, err := e.commandCredentials(ctx, a, c)
		if errors.Is(err, store.ErrNotFound) {
			what := "its BMC credentials"
			if c.Kind == "boot.prepareInstance" {
				what = "the node's user-data"
			}
			broken[c.ID] = what + " cannot be opened: " + err.Error()
			continue
		}
		if err != nil {
			return nil, err
		}
		if cr != nil {
			creds[c.ID] = cr
		}
	}
	cands = slices.DeleteFunc(cands, func(c store.Command) bool { _, b := broken[c.ID]; return b })
	if a.Kind == "node" && len(broken) == 0 && !slices.ContainsFunc(cands, takenInWriter) {
		return e.offer(a, cands, creds, limit)
	}
	hand, err := handouts(cands, creds)
	if err != nil {
		return nil, err
	}
	var out []store.Command
	err = e.st.Write(ctx, func(tx *store.Tx) error {
		for id, why := range broken {
			closed, _, err := tx.WithdrawCommand(ctx, id, why)
			if err != nil {
				return err
			}
			if closed {
				if err := tx.AppendEvent(ctx, store.Event{Actor: "queue", Kind: "command.failed", Reason: why,
					Data: mustData(map[string]any{"command": id, "agent": a.ID})}); err != nil {
					return err
				}
			}
		}
		e.sentMu.Lock()
		departed := e.sent[a.ID].over(a.ConnID)
		e.sentMu.Unlock()
		if departed {
			// The connection ended while this claim waited for the writer: nothing is assigned
			// to an agent whose departure is applied (or about to be), which would hold the
			// site's commands from its other agents. Or a new connection of the agent replaced
			// it: nothing is assigned to go to a dead stream.
			return nil
		}
		cmds, err := tx.AssignCommands(ctx, a.ID, cands, holderKinds()...)
		if err != nil {
			return err
		}
		out = out[:0]
		e.sentMu.Lock()
		defer e.sentMu.Unlock()
		o := e.sent[a.ID]
		if o == nil {
			// An agent whose connection was not announced (in-process callers).
			o = &offered{conn: a.ConnID, ids: map[string]bool{}}
			e.sent[a.ID] = o
		}
		// A connection replaced since the check above records nothing: what it returns goes to
		// a dead stream, and the successor must be offered it. Its first claim does: it reads
		// the store after the successor's connection is written (Connected), a write that
		// follows this one.
		offered := o.on(a.ConnID)
		if offered == nil {
			offered = map[string]bool{}
		}
		gc := &gateCache{batches: map[string]*store.Batch{}, approvals: map[string]int{}, required: map[string]int{}}
		for i := range cmds {
			if offered[cmds[i].ID] || len(out) == limit {
				continue
			}
			if ok, err := e.gate(ctx, tx, a, &cmds[i], gc); err != nil || !ok {
				if err != nil {
					return err
				}
				continue
			}
			// Before outgoing: its token must not reach the row (and the lease row is locked
			// before join tokens, as BootLease does).
			if err := e.recordBootEntry(ctx, tx, a, cmds[i]); err != nil {
				return err
			}
			if err := e.outgoing(ctx, tx, &cmds[i], hand[cmds[i].ID]); err != nil {
				return err
			}
			// The agent gets the command's whole time from now: its wait in the queue is not
			// the command's (the step's clock, stepDue, agrees).
			cmds[i].Deadline = takenDeadline(cmds[i].CreatedAt, cmds[i].Deadline, tx.At())
			out = append(out, cmds[i])
		}
		ids := make([]string, 0, len(out))
		for _, c := range out {
			if !offered[c.ID] {
				offered[c.ID] = true
				ids = append(ids, c.ID)
			}
		}
		// Offered only if assigned: a write undone (run again, or failed) offered nothing.
		tx.OnUndo(func() {
			e.sentMu.Lock()
			defer e.sentMu.Unlock()
			for _, id := range ids {
				delete(offered, id)
			}
		})
		return nil
	})
	if err == nil {
		e.rememberAttested(a, out)
	}
	return out, err
}

// rememberAttested keeps, on SQLite, the kinds of the attested commands handed to node agent a,
// for their outcomes' check before the writer (preverifyClaimed).
func (e *Engine) rememberAttested(a Agent, out []store.Command) {
	if e.st.Engine() != store.SQLite || a.Kind != "node" {
		return
	}
	for _, c := range out {
		if c.Attested {
			e.attestedKinds.Put(c.ID, c.Kind)
		}
	}
}

// takenInWriter says whether handing c out writes beside its assignment: a boot entry
// (recordBootEntry), and for the boot entries that boot something a join token (outgoing).
// Such kinds run on the site; a node agent's claim of one goes through the writer all the same.
func takenInWriter(c store.Command) bool { return bootEntryKind(c.Kind) != "" }

// offer hands node agent a the candidates of its claim without a write. A node agent's claim
// assigns nothing: its node's ramdisk commands go to no other agent (they are its node's and
// generation's), so there is nothing to move elsewhere should it go. Its acknowledgement takes
// them (AckAll: assigns each, gates a destructive one, marks it delivered, in one write), and
// the agent runs only those whose acknowledgement was recorded: one withdrawn or cancelled
// since this read is refused there and never runs. What is offered is recorded per connection
// as by a claim through the writer, checked and marked under one lock, so that two claims of
// one connection never offer a command twice.
func (e *Engine) offer(a Agent, cands []store.Command, creds map[string]map[string]any, limit int) ([]store.Command, error) {
	for i := range cands {
		if err := withExtra(&cands[i], creds[cands[i].ID]); err != nil {
			return nil, err
		}
	}
	now := e.st.NowMicros()
	var out []store.Command
	e.sentMu.Lock()
	o := e.sent[a.ID]
	if o == nil {
		// An agent whose connection was not announced (in-process callers).
		o = &offered{conn: a.ConnID, ids: map[string]bool{}}
		e.sent[a.ID] = o
	}
	if offered := o.on(a.ConnID); offered != nil {
		for _, c := range cands {
			if offered[c.ID] || len(out) == limit {
				continue
			}
			offered[c.ID] = true
			// The agent gets the command's whole time from now (as a claim through the writer).
			c.Deadline = takenDeadline(c.CreatedAt, c.Deadline, now)
			out = append(out, c)
		}
	}
	// (else the connection ended or was replaced: what it would take goes to a dead stream)
	e.sentMu.Unlock()
	e.rememberAttested(a, out)
	return out, nil
}

// maxAttestedKinds bounds the attested commands whose kinds a server keeps for their outcomes'
// early check (a few per machine in a workflow; emptied when full, which only skips the early
// check of the outcomes still out).
const maxAttestedKinds = 1 << 16

// forget drops finished commands from an agent's offered set, and from what it is told to
// cancel: it reported the command's end.
func (e *Engine) forget(agentID, commandID string) {
	e.sentMu.Lock()
	if o := e.sent[agentID]; o != nil {
		delete(o.ids, commandID)
	}
	e.sentMu.Unlock()
	e.cancels.forget(agentID, commandID)
}

// offered is the set of commands offered on one connection of an agent; gone: the connection
// ended (Disconnected), and no successor connected since.
type offered struct {
	conn string
	ids  map[string]bool
	gone bool
	// scanned: when a claim on conn last looked in the store for every command assigned to
	// the agent (zero: never; Engine.Claim).
	scanned time.Time
}

// on returns the set if it is connection conn's, else nil (read-only: a nil map reads empty).
func (o *offered) on(conn string) map[string]bool {
	if o == nil || o.conn != conn || o.gone {
		return nil
	}
	return o.ids
}

// over reports whether connection conn ended, or another connection of the agent replaced it:
// what it takes would go to a dead stream.
func (o *offered) over(conn string) bool { return o != nil && (o.gone || o.conn != conn) }

// handout is what a claimed command carries to its agent beyond its row: its arguments with
// what must reach only the agent (its BMC credentials or the node's user-data encrypted to the
// agent, a boot entry's one-time join token), and that token, whose hash the claim stores. It
// is made before the single writer (handouts), for every candidate of the claim.
type handout struct {
	args  string // "": the row's
	token *joinToken
}

// joinToken is a boot entry's one-time token: what the agent gets, and what the store keeps.
type joinToken struct {
	plain, kind string
	hash        []byte
}

// handouts makes, before the single writer, what each of cands carries to its agent: creds (by
// command, commandCredentials) and, for a boot entry's command, a new join token, merged into
// its arguments. A candidate the claim does not take leaves its token unused and unstored.
func handouts(cands []store.Command, creds map[string]map[string]any) (map[string]handout, error) {
	out := make(map[string]handout, len(cands))
	for _, c := range cands {
		extra := maps.Clone(creds[c.ID])
		var h handout
		if prefix, kind, ok := entryToken(bootEntryKind(c.Kind)); ok {
			plain, hash, err := pki.NewToken(prefix)
			if err != nil {
				return nil, err
			}
			h.token = &joinToken{plain: plain, kind: kind, hash: hash}
			if extra == nil {
				extra = map[string]any{}
			}
			extra["token"] = plain
		}
		if len(extra) > 0 {
			if err := withExtra(&c, extra); err != nil {
				return nil, err
			}
			h.args = c.Args
		}
		out[c.ID] = h
	}
	return out, nil
}

// outgoing hands claimed command c out as h says: it stores h's join token (its hash) and puts
// in c the arguments for the agent. The row keeps its arguments without them.
func (e *Engine) outgoing(ctx context.Context, tx *store.Tx, c *store.Command, h handout) error {
	if t := h.token; t != nil {
		if err := tx.InsertJoinToken(ctx, store.JoinToken{Hash: t.hash, Kind: t.kind, SiteID: c.SiteID, NodeID: c.NodeID, CommandID: c.ID,
			Generation: c.Generation, ExpiresAt: tx.At() + (2 * time.Hour).Microseconds()}); err != nil {
			return err
		}
		e.joinTokens.Put(string(t.hash), tokenNode{node: c.NodeID, tenant: c.TenantID, gen: c.Generation})
		tx.OnUndo(func() { e.joinTokens.Delete(string(t.hash)) })
	}
	if h.args != "" {
		c.Args = h.args
	}
	return nil
}

// withExtra adds extra to c's arguments, for the agent only: the row keeps the arguments
// without them.
func withExtra(c *store.Command, extra map[string]any) error {
	if len(extra) == 0 {
		return nil
	}
	var args map[string]any
	if err := json.Unmarshal([]byte(c.Args), &args); err != nil {
		return fmt.Errorf("decoding arguments of command %s: %w", c.ID, err)
	}
	maps.Copy(args, extra)
	b, _ := json.Marshal(args)
	c.Args = string(b)
	return nil
}

// commandCredentials returns the BMC credentials command c carries to agent a, encrypted to a's
// certificate (JWE), or nil for a command that needs none. It needs no write, so claims run it
// before the single writer: opening a sealed secret reads the store, and inside the writer that
// read waited for a read connection behind every agent's claim.
func (e *Engine) commandCredentials(ctx context.Context, a Agent, c store.Command) (map[string]any, error) {
	if c.Kind == "boot.prepareInstance" {
		return e.commandUserData(ctx, a, c)
	}
	// The kinds table says which kinds carry them (bmc.provisionInband: to the node's ramdisk,
	// which creates that credential on its BMC).
	if k, err := command.Lookup(c.Kind); err != nil || !k.BMCCredentials {
		return nil, nil
	}
	if len(a.CertDER) == 0 || e.cfg.Secrets == nil {
		return nil, nil // in-process agents (simulation) need no credentials
	}
	var args struct {
		BMC            store.BMCRef `json:"bmc"`
		NewPasswordRef string       `json:"newPasswordRef"`
	}
	if err := json.Unmarshal([]byte(c.Args), &args); err != nil {
		return nil, fmt.Errorf("decoding arguments of command %s: %w", c.ID, err)
	}
	jwe, err := e.credentialsFor(ctx, a, args.BMC)
	if err != nil {
		return nil, fmt.Errorf("command %s: %w", c.ID, err)
	}
	out := map[string]any{"credentials": jwe}
	if c.Kind == "bmc.rotate" {
		// The new password, for this agent only: the row carries its reference alone.
		next := store.BMCRef{UsernameRef: args.BMC.UsernameRef, PasswordRef: args.NewPasswordRef}
		if out["newCredentials"], err = e.credentialsFor(ctx, a, next); err != nil {
			return nil, fmt.Errorf("command %s, the new credential: %w", c.ID, err)
		}
	}
	return out, nil
}

// commandUserData returns the operator user-data a boot.prepareInstance carries to agent a,
// encrypted to a's certificate (JWE), or nil when the command names none (the row holds only
// its reference: buildCommand). Like BMC credentials, in-process agents get none.
func (e *Engine) commandUserData(ctx context.Context, a Agent, c store.Command) (map[string]any, error) {
	if !strings.Contains(c.Args, `"userDataRef"`) {
		return nil, nil // most instances: no decode, no read
	}
	var args struct {
		UserDataRef string `json:"userDataRef"`
	}
	if err := json.Unmarshal([]byte(c.Args), &args); err != nil {
		return nil, fmt.Errorf("decoding arguments of command %s: %w", c.ID, err)
	}
	if args.UserDataRef == "" || len(a.CertDER) == 0 || e.cfg.Secrets == nil {
		return nil, nil
	}
	jwe, err := e.userDataFor(ctx, a, args.UserDataRef)
	if err != nil {
		return nil, fmt.Errorf("command %s: %w", c.ID, err)
	}
	return map[string]any{"userData": jwe}, nil
}

// userDataFor opens the sealed user-data ref and encrypts it to agent a (JWE). The error never
// holds the value.
func (e *Engine) userDataFor(ctx context.Context, a Agent, ref string) (string, error) {
	plain, err := e.cfg.Secrets.OpenSecret(ctx, ref)
	if err != nil {
		return "", fmt.Errorf("opening the node's user-data: %w", err)
	}
	jwe, err := pki.EncryptToAgent(a.CertDER, plain)
	if err != nil {
		return "", fmt.Errorf("encrypting the node's user-data to agent %s: %w", a.ID, err)
	}
	return jwe, nil
}

// Ack records that a received and durably recorded the command.
func (e *Engine) Ack(ctx context.Context, a Agent, commandID string) error {
	refused, err := e.AckAll(ctx, a, []string{commandID})
	if err != nil {
		return err
	}
	return refused[commandID]
}

// AckAll records that a received and durably recorded the commands ids, in one write (a node
// agent's also takes them: assigned to it and, if destructive, gated; offer). It
// returns, by id, the acknowledgements refused (a command unknown, not a's or ended:
// ErrNotFound, ErrNotYours, ErrFinished) — the agent runs only those accepted; one
// acknowledged before and not ended is accepted again (an agent back from a restart).
func (e *Engine) AckAll(ctx context.Context, a Agent, ids []string) (map[string]error, error) {
	var refused map[string]error
	var unknown []string
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		refused, unknown = map[string]error{}, nil
		if a.Kind == "node" {
			// Its claim assigned nothing and gated nothing (offer): a destructive command is
			// gated here, before the agent may run it.
			if err := e.gateTaken(ctx, tx, a, ids); err != nil {
				return err
			}
		}
		var done map[string]bool
		var err error
		by := store.Acknowledger{AgentID: a.ID, Node: a.Kind != "site", Generation: a.Generation}
		if a.Kind == "node" {
			by.NodeID = a.NodeID
		}
		done, err = tx.DeliverCommands(ctx, ids, by)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if done[id] {
				continue
			}
			c, err := tx.Command(ctx, id)
			switch {
			case errors.Is(err, store.ErrNotFound):
				refused[id] = fmt.Errorf("ack of %s by %s: %w", id, a.ID, err)
				unknown = append(unknown, id)
			case err != nil:
				return err
			case !agentsCommand(a, c) && !nodeTakes(a, c):
				refused[id] = fmt.Errorf("ack of %s by %s: %w", id, a.ID, ErrNotYours)
			case command.State(c.State).Final():
				refused[id] = fmt.Errorf("ack of %s by %s: %w (%s)", id, a.ID, ErrFinished, c.State)
			}
		}
		return nil
	})
	if err == nil && len(unknown) > 0 {
		e.noteUnknown(ctx, a, "acknowledged", unknown)
	}
	return refused, err
}

// nodeTakes says whether node agent a's acknowledgement takes c, unassigned: a ramdisk command of
// its node and identity generation (what its claim offers, Store.CommandCandidates). Pure.
func nodeTakes(a Agent, c store.Command) bool {
	return a.Kind == "node" && c.TargetAgent == "" && c.RunsOn == string(command.OnRamdisk) && c.NodeID == a.NodeID && c.Generation == a.Generation
}

// gateTaken gates the destructive commands among ids that node agent a's acknowledgement is
// about to take (queued, its own or its node's unassigned): one refused fails there (gate), and
// its acknowledgement is refused. Without any approvals policy nothing is read.
func (e *Engine) gateTaken(ctx context.Context, tx *store.Tx, a Agent, ids []string) error {
	anyPolicy, err := tx.AnyApprovalPolicy(ctx)
	if err != nil || !anyPolicy {
		return err
	}
	gc := &gateCache{batches: map[string]*store.Batch{}, approvals: map[string]int{}, required: map[string]int{}, policies: &anyPolicy}
	for _, id := range ids {
		c, err := tx.Command(ctx, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if !c.Destructive || c.State != string(command.Queued) || !agentsCommand(a, c) && !nodeTakes(a, c) {
			continue
		}
		if _, err := e.gate(ctx, tx, a, &c, gc); err != nil {
			return err
		}
	}
	return nil
}

// Report records a command's progress or outcome and wakes its node. Reports are idempotent and
// never move a command backwards; a report on a command already finished (cancelled by an abort,
// timed out) is kept out of the row and ignored.
//
// An outcome is taken by the node's reconciliation in the same transaction: the next step's
// command is queued with the report's commit. Nothing else reconciles the node meanwhile: on
// SQLite the single writer runs one transaction at a time; on PostgreSQL the report locks the
// node's row first, before the command's (the reconciler's order), and a worker's
// reconciliation of the node holds that lock too. Should the reconciliation fail, its writes
// alone are undone and the node is woken for the reconciler instead.
func (e *Engine) Report(ctx context.Context, a Agent, u Update) error {
	final := command.State(u.State).Final()
	// On PostgreSQL an outcome's command is read before the writer (and its attestation checked
	// there): the transaction then locks the node and updates the row only if it is still as
	// read (both in one round trip), else reads it itself. SQLite's writer reads the row
	// itself: a read beside the one writer cost the process more than the writer's own (when
	// measured, SQLite's page cache was shared and its lock held the writer back; not measured
	// again since each connection has its own), and
	// the attestation is checked before from what this server handed out (preverifyClaimed).
	var pre *store.Command
	if final {
		if e.st.Engine() == store.SQLite {
			if len(u.NodeSig) > 0 {
				e.preverifyClaimed(ctx, a, u) // (what it found, the engine's check finds again)
			}
		} else if c, err := e.st.Command(ctx, u.CommandID); err == nil {
			pre = &c
			if len(u.NodeSig) > 0 {
				e.preverify(ctx, c, u)
			}
			if e.afterPreRead != nil {
				e.afterPreRead()
			}
		}
		defer e.attestedKinds.Delete(u.CommandID)
	}
	var fx effects
	var ended store.Command // the command, if this report ended it
	woken, lost := false, false
	lockNode := e.st.Engine() != store.SQLite && pre != nil && pre.NodeID != ""
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		fx, ended, woken, lost = effects{}, store.Command{}, false, false
		var locked *lockedNode
		// withLock: the update the row as read before calls for went out with the node's lock
		// (sentNext), and applied says whether the row was still as read.
		var withLock, applied bool
		var sentNext store.Command
		if lockNode {
			// The node before the command, as the reconciler locks them (a command's node
			// never changes, so the row read before names it). The reconciliation below
			// takes the row, its wake sequence and its open workflow as read here: nothing
			// in between writes them but this transaction's command update.
			var ln store.LockedNode
			var err error
			if next, write, rerr := reported(*pre, a, u, tx.At()); rerr == nil && write {
				sentNext, withLock = next, true
				ln, applied, err = tx.LockNodeForReconcileAndUpdateCommand(ctx, pre.NodeID, &sentNext, *pre)
			} else {
				ln, err = tx.LockNodeForReconcile(ctx, pre.NodeID)
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
			if err == nil {
				locked = &lockedNode{n: ln.Node, seq: ln.Seq, wf: &ln.Workflow, wfOpen: ln.Open}
			}
		}
		var c store.Command
		read := pre == nil || withLock && !applied // (the row changed since: read it here)
		if read {
			var err error
			if c, err = tx.Command(ctx, u.CommandID); err != nil {
				return err
			}
		} else {
			c = *pre
		}
		for {
			next, write, err := reported(c, a, u, tx.At())
			if !read && (err != nil || !write) {
				// Decided on the row as read before: confirm on the row itself.
				if c, err = tx.Command(ctx, u.CommandID); err != nil {
					return err
				}
				read = true
				continue
			}
			if err == nil && !write && final && command.State(c.State).Final() {
				// Ended already (given up under the agent, which was told to cancel it): the
				// agent's report on it ends the cancel.
				return tx.CancelReported(ctx, c.ID, a.ID)
			}
			if err != nil || !write {
				return err
			}
			switch {
			case read:
				if err := tx.ReportCommand(ctx, &next); err != nil {
					return err
				}
			case withLock:
				// The row as read before, as decided before the node's lock: written with it.
				next = sentNext
			default:
				ok, err := tx.UpdateCommandIf(ctx, &next, c)
				if err != nil {
					return err
				}
				if !ok {
					if c, err = tx.Command(ctx, u.CommandID); err != nil {
						return err
					}
					read = true
					continue
				}
			}
			c = next
			lost = c.State == string(command.Lost)
			if command.State(c.State).Final() {
				ended = c
			}
			break
		}
		if !command.State(c.State).Final() || c.State != u.State {
			return nil
		}
		if c.NodeID == "" {
			return nil
		}
		var err error
		fx, woken, err = e.wakeOrReconcile(ctx, tx, c.NodeID, locked, "command "+u.State, c)
		return err
	})
	if errors.Is(err, store.ErrNotFound) && pre == nil {
		e.noteUnknown(ctx, a, "reported", []string{u.CommandID})
	}
	if err == nil && lost {
		e.lost.Add(1)
	}
	if err == nil && ended.ID != "" {
		fx.ended = append(fx.ended, ended)
	}
	if err == nil && final {
		e.forget(a.ID, u.CommandID)
		e.after(fx)
		if woken {
			e.Nudge()
		}
	}
	return err
}

// agentsCommand says whether c is agent a's: assigned to it and, for a node's agent, of its
// identity generation (a node agent's id names the node only: a certificate revoked by
// metal.revokeIdentity, on a stream opened before, must not act on the new generation's
// commands). Pure.
func agentsCommand(a Agent, c store.Command) bool {
	if c.TargetAgent != a.ID {
		return false
	}
	return a.Kind == "site" || c.Generation == a.Generation
}

// reported applies agent a's report u to command c at time at: the command to write, and
// whether to write it (reports never move a command backwards; one on a finished command is
// ignored). A report on another agent's command is refused.
func reported(c store.Command, a Agent, u Update, at int64) (store.Command, bool, error) {
	if !agentsCommand(a, c) {
		return c, false, fmt.Errorf("report on %s by %s: %w", u.CommandID, a.ID, ErrNotYours)
	}
	to := command.State(u.State)
	if u.State == c.State || !command.CanMove(command.State(c.State), to) {
		if to == command.Running && c.State == string(command.Running) && u.ProgressTotal > 0 {
			c.Progress = progressJSON(u)
			return c, true, nil
		}
		return c, false, nil
	}
	if c.DeliveredAt == 0 {
		c.DeliveredAt = at
	}
	c.State = u.State
	if u.ProgressTotal > 0 || u.ProgressMessage != "" {
		c.Progress = progressJSON(u)
	}
	if to.Final() {
		c.FinishedAt = at
		c.Result, c.Error = string(u.Result), u.Error
		c.ResultSig, c.SignerCert = u.NodeSig, u.SignerCertDER
	}
	return c, true, nil
}

// lockedNode is a node's row as a transaction locked and read it, with its wake sequence read
// in the same statement and, if wf is not nil, its open workflow read with it (wfOpen false:
// none; store.Tx.LockNodeForReconcile).
type lockedNode struct {
	n      store.Node
	seq    int64
	wf     *store.Workflow
	wfOpen bool
}

// reconcileIn reconciles nodeID inside tx, which just wrote why (a command's outcome, passed as
// known, or a node agent's arrival), in a savepoint of its own, and returns the notices for
// agents. The node is due again at the nearest deadline its workflow waits for (or at an
// earlier one still ahead that its wake-up row holds: store.Tx.SetWakeUp), and at no other
// time, unless it was woken by a write this reconciliation may not have seen. locked is
// the node as tx locked and read it, if it did (nil: the run reads it).
func (e *Engine) reconcileIn(ctx context.Context, tx *store.Tx, nodeID string, locked *lockedNode, known ...store.Command) (effects, error) {
	var fx effects
	// On SQLite this run sees every write committed before it (one writer), so it owes no
	// earlier wake-up. On PostgreSQL a writer that does not lock the node may wake it
	// meanwhile: the wake sequence read first tells SetWakeUp to leave such a wake-up be. (Read
	// before the savepoint: a read changes nothing to undo.)
	seq := int64(-1)
	var node *store.Node
	switch {
	case locked != nil && locked.n.ID == nodeID:
		node = &locked.n
		if e.st.Engine() != store.SQLite {
			seq = locked.seq
		}
	case e.st.Engine() != store.SQLite:
		var err error
		if seq, err = tx.WakeUpSeq(ctx, nodeID); err != nil {
			return fx, err
		}
	}
	err := tx.Savepoint(ctx, func() error {
		// A rotation's outcome is taken once its bmc.rotate command finishes, which only a
		// report (this path, with that command known) or an agent's departure (the reconciler,
		// which always looks) makes happen: other runs here need not look for one.
		r := &run{e: e, tx: tx, ctx: ctx, rotationSettled: true, locked: node}
		if node != nil && locked.wf != nil {
			// Read with the node's row, by the same transaction: nothing wrote it since.
			r.wf, r.wfLoaded, r.wfOpen = *locked.wf, true, locked.wfOpen
		}
		for _, c := range known {
			r.keep(c)
			if c.Kind == "bmc.rotate" {
				r.rotationSettled = false
			}
		}
		again, err := r.node(nodeID)
		if err != nil {
			return err
		}
		fx = r.effects()
		return tx.SetWakeUp(ctx, nodeID, "deadline", again, seq)
	})
	if err == nil {
		e.reconciled.Add(1)
		tx.OnUndo(func() { e.reconciled.Add(-1) })
	}
	return fx, err
}

// wakeOrReconcile reconciles nodeID in tx (see Report), or, should that fail, wakes it for the
// reconciler: what is left to do once tx commits, and whether the reconciler was woken.
func (e *Engine) wakeOrReconcile(ctx context.Context, tx *store.Tx, nodeID string, locked *lockedNode, reason string, known ...store.Command) (effects, bool, error) {
	fx, err := e.reconcileIn(ctx, tx, nodeID, locked, known...)
	if err == nil {
		return fx, false, nil
	}
	e.log.Warn("reconciling a node in the transaction that changed it; left to the reconciler", "node", nodeID, "reason", reason, "error", err)
	return effects{}, true, tx.Wake(ctx, nodeID, reason, 0)
}

// preverify checks an attested result's signature before its report enters the writer: the
// engine checks it again from the stored row when it takes the result, and then finds it
// verified (pki remembers verified signatures). A failure here changes nothing: the engine's
// check decides.
func (e *Engine) preverify(ctx context.Context, c store.Command, u Update) error {
	if e.ca == nil || e.acceptIngested || len(u.SignerCertDER) == 0 {
		return nil
	}
	st := pki.Statement{CommandID: c.ID, NodeID: c.NodeID, Kind: c.Kind, Generation: c.Generation, ResultSHA256: pki.ResultDigest(u.Result)}
	var err error
	if gerr := e.cpu.run(ctx, func() {
		err = pki.VerifyStatement(e.ca, u.SignerCertDER, st, u.NodeSig, c.Generation, time.Now())
	}); gerr != nil {
		return gerr
	}
	return err
}

// preverifyClaimed is preverify for the outcome of an attested command this server handed to
// the node agent a: the statement its signature covers is rebuilt from what the server handed
// out (the command's kind) and the agent's identity (a node agent runs its node's commands, of
// its identity generation). The engine's own check, from the stored row, decides; a statement
// rebuilt wrong only fails here.
// checked says whether it checked (the command was handed out here, to a node agent), err
// what the check found.
func (e *Engine) preverifyClaimed(ctx context.Context, a Agent, u Update) (checked bool, err error) {
	kind, ok := e.attestedKinds.Get(u.CommandID)
	if !ok || a.Kind != "node" {
		return false, nil
	}
	return true, e.preverify(ctx, store.Command{ID: u.CommandID, NodeID: a.NodeID, Kind: kind, Generation: a.Generation}, u)
}

func progressJSON(u Update) string {
	b, _ := json.Marshal(map[string]any{"done": u.ProgressDone, "total": u.ProgressTotal, "message": u.ProgressMessage})
	return string(b)
}

// ReapForTests applies departed agents' commands now (the engine loop does it periodically).
func (e *Engine) ReapForTests(ctx context.Context) (int, error) { return 0, e.reapAgents(ctx) }

// Discovery is a machine a site agent saw PXE-booting with no boot entry (self-asserted data:
// never enough to enroll or bind anything by itself).
type Discovery struct {
	MAC, UUID, Arch     string
	FirstSeen, LastSeen time.Time
	// Inventory is what a discovery-mode ramdisk reported (acceptance flow): a JSON object.
	Inventory string
}

// maxInventory bounds a discovery-mode ramdisk's reported inventory (as netboot does).
const maxInventory = 64 << 10

// validInventory keeps a reported inventory only when it is a JSON object of bounded size. Pure.
func validInventory(s string) string {
	if s == "" || len(s) > maxInventory {
		return ""
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal([]byte(s), &obj) != nil {
		return ""
	}
	return s
}

// maxDiscoveriesPerReport bounds what one status report may record.
const maxDiscoveriesPerReport = 4096

// RecordDiscovered stores what a site agent reports seeing, validated, and refreshes its liveness.
// A MAC-less node of the site whose product UUID a sighting names is woken (await.macCandidate).
func (e *Engine) RecordDiscovered(ctx context.Context, a Agent, ds []Discovery) error {
	if len(ds) > maxDiscoveriesPerReport {
		ds = ds[:maxDiscoveriesPerReport]
	}
	woke := false
	var enroll []autoEnroll
	err := e.st.Write(ctx, func(tx *store.Tx) error {
		woke, enroll = false, nil
		if err := tx.AgentSeen(ctx, a.ID, a.ConnID); err != nil {
			return err
		}
		for _, d := range ds {
			hw, err := net.ParseMAC(d.MAC)
			if err != nil || len(hw) != 6 {
				continue // an agent's bad report does not reach the store
			}
			uuid := strings.ToLower(d.UUID)
			if len(uuid) > 36 || strings.ContainsFunc(uuid, func(r rune) bool { return !strings.ContainsRune("0123456789abcdef-", r) }) {
				uuid = ""
			}
			arch := d.Arch
			if len(arch) > 16 || strings.ContainsFunc(arch, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') }) {
				arch = ""
			}
			first, last := d.FirstSeen.UnixMicro(), d.LastSeen.UnixMicro()
			if d.FirstSeen.IsZero() || first > tx.At() {
				first = tx.At()
			}
			if d.LastSeen.IsZero() || last > tx.At() || last < first {
				last = tx.At()
			}
			inv := validInventory(d.Inventory)
			if err := tx.RecordDiscovered(ctx, store.Discovery{SiteID: a.SiteID, MAC: hw.String(), UUID: uuid, Arch: arch, AgentID: a.ID, FirstSeen: first, LastSeen: last, Inventory: inv}); err != nil {
				return err
			}
			if inv != "" {
				pool, in, err := autoAccept(ctx, tx, a.SiteID, hw.String(), inv)
				if err != nil {
					return err
				}
				if in {
					enroll = append(enroll, autoEnroll{siteID: a.SiteID, mac: hw.String(), pool: pool})
				}
			}
			if uuid == "" {
				continue
			}
			ua, ub := UUIDForms(uuid)
			ids, err := tx.NodesWithoutMACs(ctx, a.SiteID, ua, ub)
			if err != nil {
				return err
			}
			if len(ids) > 0 {
				if err := tx.WakeMany(ctx, ids, "discovered"); err != nil {
					return err
				}
				woke = true
			}
		}
		return nil
	})
	if woke {
		e.Nudge()
	}
	if err == nil {
		e.autoEnrollAll(ctx, enroll)
	}
	return err
}
