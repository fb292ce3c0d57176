package engine

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"bcd/internal/store"
)

// Cancels. A command the control plane gives up while an agent holds it acknowledged (an
// aborted workflow, a step out of time: run.cancelCurrent) is one the agent may still be
// running: a wipe or an image write goes on until it is told to stop. The write that gives it
// up records the request in the command's row (store.Tx.UpdateCommand: cancel_requested_at),
// so that whichever server holds the agent's connection tells it, not only the one that gave
// it up. The request ends when the agent reports the command's end (Report:
// store.Tx.CancelReported), when a new boot of a node's ramdisk connects (nothing runs the old
// boot's commands any more: store.Tx.LosePreviousBoot), or after cancelKeep.
//
// Each server keeps the requests of the agents it serves in memory (cancelBook), which the
// gateway reads at every wake-up of an agent's stream (Gateway.Cancels) without reading the
// store. It learns them:
//   - from its own give-ups, once committed (cancel: the fast path);
//   - when an agent connects (loadCancels: one read of the agent's requests);
//   - from another server's give-up, through the notice it sends on PostgreSQL
//     (cancelNotice, heard by hearOthers): one read of the requests of this server's agents;
//   - at every heartbeat (refreshCancels, the same read), for notices missed.
//
// None of these reads the store per agent and per poll: the gateway's 2 s poll of each stream
// reads memory only.

// cancelKeep is how long an agent is told to cancel a command it does not report on: past
// it, the command's own deadline has ended it on the agent.
const cancelKeep = 24 * time.Hour

// maxCancels bounds the cancels kept per agent (the oldest go first).
const maxCancels = 4096

// cancelPrefix begins the notice telling the servers sharing a PostgreSQL store that an agent
// has a new cancel: "cancel:<agent id>".
const cancelPrefix = "cancel:"

func cancelNotice(agentID string) notice { return notice(cancelPrefix + agentID) }

// cancelBook holds, per agent, the commands it is to cancel as this server knows them.
type cancelBook struct {
	mu sync.Mutex
	m  map[string]map[string]cancelEntry
	// due is signalled when another server's notice says an agent this server serves has a
	// new cancel (refreshOnNotice reads them).
	due chan struct{}
}

// cancelEntry is one command to cancel: when this server learned of it, and until when the
// agent is told.
type cancelEntry struct{ added, until time.Time }

func newCancelBook() *cancelBook {
	return &cancelBook{m: map[string]map[string]cancelEntry{}, due: make(chan struct{}, 1)}
}

// addLocked records command id for agent at now; false if it was there. Called with b.mu held.
func (b *cancelBook) addLocked(agent, id string, now time.Time) bool {
	m := b.m[agent]
	if m == nil {
		m = map[string]cancelEntry{}
		b.m[agent] = m
	}
	if _, ok := m[id]; ok {
		return false
	}
	if len(m) >= maxCancels {
		oldest := ""
		for id, en := range m {
			if oldest == "" || en.added.Before(m[oldest].added) {
				oldest = id
			}
		}
		delete(m, oldest)
	}
	m[id] = cancelEntry{added: now, until: now.Add(cancelKeep)}
	return true
}

// forget drops agent's cancel of command id (it reported the command's end).
func (b *cancelBook) forget(agent, id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if m := b.m[agent]; m != nil {
		delete(m, id)
		if len(m) == 0 {
			delete(b.m, agent)
		}
	}
}

// list returns agent's cancels at now, sorted by id, dropping those past their time.
func (b *cancelBook) list(agent string, now time.Time) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.m[agent]
	var out []string
	for id, en := range m {
		if now.After(en.until) {
			delete(m, id)
			continue
		}
		out = append(out, id)
	}
	if len(m) == 0 {
		delete(b.m, agent)
	}
	slices.Sort(out)
	return out
}

// sync makes agent's cancels what the store listed (pending), read at or after read: an entry
// learned before read that the store no longer lists has ended (the agent reported on it at
// another server, or it expired); one learned since is kept (the store may not have shown it
// yet). complete false: the store listed only part (a bounded read), and nothing is dropped.
// Returns the cancels added.
func (b *cancelBook) sync(agent string, pending []store.Cancel, read, now time.Time, complete bool) []store.Cancel {
	b.mu.Lock()
	defer b.mu.Unlock()
	if m := b.m[agent]; m != nil && complete {
		listed := make(map[string]bool, len(pending))
		for _, c := range pending {
			listed[c.CommandID] = true
		}
		for id, en := range m {
			if !listed[id] && en.added.Before(read) {
				delete(m, id)
			}
		}
		if len(m) == 0 {
			delete(b.m, agent)
		}
	}
	var added []store.Cancel
	for _, c := range pending {
		if b.addLocked(agent, c.CommandID, now) {
			added = append(added, c)
		}
	}
	return added
}

// dropExcept forgets, of the agents not in served, what was learned before read: this server
// tells them nothing (it learns their cancels again when they connect).
func (b *cancelBook) dropExcept(served map[string]bool, read time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for agent, m := range b.m {
		if served[agent] {
			continue
		}
		for id, en := range m {
			if en.added.Before(read) {
				delete(m, id)
			}
		}
		if len(m) == 0 {
			delete(b.m, agent)
		}
	}
}

// cancel records, once their transaction committed, the commands given up while an agent held
// them acknowledged (run.cancelCurrent; the same write requested their cancel in the store):
// this server tells the agents it serves at once, and, on PostgreSQL, tells the other servers
// that those agents have a new cancel (the server serving one reads it from the store). A
// command given up before its agent acknowledged it needs no cancel: the agent's
// acknowledgement is refused (ErrFinished), and it never runs it.
func (e *Engine) cancel(cmds []store.Command) {
	now := time.Now()
	var agents []string
	e.cancels.mu.Lock()
	for _, c := range cmds {
		if c.TargetAgent == "" || c.DeliveredAt == 0 {
			continue
		}
		e.cancels.addLocked(c.TargetAgent, c.ID, now)
		agents = append(agents, c.TargetAgent)
	}
	e.cancels.mu.Unlock()
	if len(agents) == 0 || e.st.Engine() != store.Postgres {
		return
	}
	slices.Sort(agents)
	for _, a := range slices.Compact(agents) {
		select {
		case e.outbox <- cancelNotice(a):
		default: // full: the serving server reads it at its next heartbeat
		}
	}
}

// Cancels lists the commands agent a is to cancel (gateway.Canceller), by id.
func (e *Engine) Cancels(a Agent) []string { return e.cancels.list(a.ID, time.Now()) }

// serves says whether this server holds a live connection of agent id.
func (e *Engine) serves(id string) bool {
	e.sentMu.Lock()
	defer e.sentMu.Unlock()
	o := e.sent[id]
	return o != nil && !o.gone
}

// served lists the agents this server holds a live connection of.
func (e *Engine) served() map[string]bool {
	e.sentMu.Lock()
	defer e.sentMu.Unlock()
	out := make(map[string]bool, len(e.sent))
	for id, o := range e.sent {
		if !o.gone {
			out[id] = true
		}
	}
	return out
}

// loadCancels learns, as agent a connects, the cancels it is to be told (given up by any
// server, before this connection or while it was away). A failed read is logged: the next
// heartbeat reads them again.
func (e *Engine) loadCancels(ctx context.Context, a Agent) {
	if a.Kind == "os" {
		return // runs no commands
	}
	read := time.Now()
	pending, err := e.st.PendingCancels(ctx, a.ID)
	if err != nil {
		e.log.LogAttrs(ctx, slog.LevelWarn, "reading the cancels of a connecting agent; read again at the next heartbeat",
			slog.String("agent", a.ID), slog.Any("error", err))
		return
	}
	e.cancels.sync(a.ID, pending, read, time.Now(), len(pending) < store.MaxPendingCancels)
}

// refreshCancels reads the cancels of every agent this server serves (one read), makes them
// what this server tells, and wakes the streams of agents with new ones.
func (e *Engine) refreshCancels(ctx context.Context) error {
	read := time.Now()
	pending, err := e.st.ServerCancels(ctx, e.owner)
	if err != nil {
		return err
	}
	byAgent := map[string][]store.Cancel{}
	for _, c := range pending {
		byAgent[c.AgentID] = append(byAgent[c.AgentID], c)
	}
	served := e.served()
	complete := len(pending) < store.MaxPendingCancels
	now := time.Now()
	wake := map[notice]bool{}
	for agent := range served {
		for _, c := range e.cancels.sync(agent, byAgent[agent], read, now, complete) {
			wake[noticeFor(store.Command{RunsOn: c.RunsOn, NodeID: c.NodeID, SiteID: c.SiteID})] = true
		}
	}
	if complete {
		e.cancels.dropExcept(served, read)
	}
	for n := range wake {
		e.subs.signal(n)
	}
	return nil
}

// heardCancel acts on another server's notice n if it is a cancel's (cancelNotice): when this
// server serves the agent, it reads its cancels (refreshOnNotice). Reports whether n was one.
func (e *Engine) heardCancel(n string) bool {
	agent, ok := strings.CutPrefix(n, cancelPrefix)
	if !ok {
		return false
	}
	if e.serves(agent) {
		select {
		case e.cancels.due <- struct{}{}:
		default: // a read is due already, and reads what this notice is about
		}
	}
	return true
}

// refreshOnNotice reads the cancels of this server's agents each time another server's notice
// said one of them has a new cancel (several notices while a read runs: one more read), until
// ctx ends.
func (e *Engine) refreshOnNotice(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.cancels.due:
		}
		if err := e.refreshCancels(ctx); err != nil && ctx.Err() == nil {
			e.log.LogAttrs(ctx, slog.LevelWarn, "reading the cancels of this server's agents; read again at the next heartbeat", slog.Any("error", err))
		}
	}
}
