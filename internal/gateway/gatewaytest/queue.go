// Package gatewaytest provides in-memory fakes of the gateway's Queue and Identities (with a
// real pki.CA) and a real TLS HTTP/2 gateway on loopback, for tests and simulations.
package gatewaytest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/pki"
)

// Command states of the fake queue.
const (
	Queued    = "queued"
	Assigned  = "assigned" // claimed by an agent, not yet acknowledged
	Delivered = "delivered"
	Running   = gateway.StateRunning
	Succeeded = gateway.StateSucceeded
	Failed    = gateway.StateFailed
	Lost      = gateway.StateLost // reported interrupted
)

// Entry is the fake queue's record of one command.
type Entry struct {
	gateway.Command
	Target    string // agent key the command is for
	State     string
	Agent     string // agent key it was assigned to
	Claims    int    // times handed out by Claim
	Acks      int    // acks recorded
	Updates   []gateway.Update
	Final     gateway.Update // the final update, as received
	Cancelled bool
}

// Queue is an in-memory gateway.Queue and gateway.Canceller. Commands are addressed to one
// agent (AgentKey). It is safe for concurrent use.
type Queue struct {
	// LoseAck, when set before use, makes AckAll drop the acks it returns true for, as if they were
	// lost in flight: the command stays assigned and is offered again after a reconnect.
	LoseAck func(commandID string) bool
	// OnAck, when set before use, is called with every acknowledged id before AckAll takes the
	// queue's lock (it may block): an error refuses the ack, as the control plane refuses one
	// for a command it gave to another agent.
	OnAck func(commandID string) error
	// OnConnect, when set before use, is called with every Hello before Connected records it:
	// an error refuses the stream, as the control plane refuses an agent that saw a newer store
	// (gateway.ErrStoreBehind).
	OnConnect func(gateway.Hello) error

	mu        sync.Mutex
	cmds      map[string]*Entry
	pending   map[string][]string // agent key → queued ids, FIFO
	resend    map[string][]string // agent key → assigned-unacked ids due again after Connected
	subs      map[string]map[int]chan struct{}
	nextSub   int
	connected map[string]int // agent key → Connected calls
	open      map[string]int // agent key → streams open now
	hellos    []gateway.Hello
	statuses  map[string][]gateway.Status
	finals    int
	ackCalls  int                    // AckAll calls (frames' acks, per lane)
	cancelled map[string]bool        // ids cancelled and not yet final
	changed   chan struct{}          // closed and replaced on every change
	claimed   map[string][]time.Time // agent key → when each Claim was called
}

var (
	_ gateway.Queue     = (*Queue)(nil)
	_ gateway.Canceller = (*Queue)(nil)
)

// NewQueue makes an empty queue.
func NewQueue() *Queue {
	return &Queue{
		cmds: map[string]*Entry{}, pending: map[string][]string{}, resend: map[string][]string{},
		subs: map[string]map[int]chan struct{}{}, connected: map[string]int{}, open: map[string]int{},
		statuses: map[string][]gateway.Status{}, changed: make(chan struct{}), cancelled: map[string]bool{},
		claimed: map[string][]time.Time{},
	}
}

// AgentKey is how the fake addresses agents: site agents by site and agent, nodes (and their
// tenants) by node.
func AgentKey(a gateway.AgentRef) string {
	if a.Kind == pki.KindSiteAgent {
		return "site/" + a.SiteID + "/" + a.AgentID
	}
	return "node/" + a.NodeID
}

// Enqueue adds commands for agent to, and wakes its streams.
func (q *Queue) Enqueue(to gateway.AgentRef, cmds ...gateway.Command) {
	q.enqueue(to, true, cmds)
}

// EnqueueQuietly adds commands for agent to without waking its streams, as a command whose
// notice was lost: only a stream's poll finds them.
func (q *Queue) EnqueueQuietly(to gateway.AgentRef, cmds ...gateway.Command) {
	q.enqueue(to, false, cmds)
}

func (q *Queue) enqueue(to gateway.AgentRef, wake bool, cmds []gateway.Command) {
	key := AgentKey(to)
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, c := range cmds {
		q.cmds[c.ID] = &Entry{Command: c, Target: key, State: Queued}
		q.pending[key] = append(q.pending[key], c.ID)
	}
	if wake {
		q.wakeLocked(key)
	}
	q.changedLocked()
}

// maxClaimTimes bounds the claim times kept per agent (the latest half are kept when full).
const maxClaimTimes = 256

// Claimed returns when each of agent a's latest claims was made, oldest first.
func (q *Queue) Claimed(a gateway.AgentRef) []time.Time {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.claimed[AgentKey(a)])
}

// Cancel marks a command cancelled; the gateway sends Cancel to its agent.
func (q *Queue) Cancel(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e, ok := q.cmds[id]; ok {
		e.Cancelled = true
		q.cancelled[id] = true
		q.wakeLocked(e.Target)
	}
}

func (q *Queue) wakeLocked(key string) {
	for _, ch := range q.subs[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (q *Queue) changedLocked() {
	close(q.changed)
	q.changed = make(chan struct{})
}

// Claim implements gateway.Queue.
func (q *Queue) Claim(_ context.Context, a gateway.AgentRef, limit int) ([]gateway.Command, error) {
	key := AgentKey(a)
	q.mu.Lock()
	defer q.mu.Unlock()
	if c := q.claimed[key]; len(c) >= maxClaimTimes {
		q.claimed[key] = append(c[:0], c[len(c)-maxClaimTimes/2:]...)
	}
	q.claimed[key] = append(q.claimed[key], time.Now())
	var out []gateway.Command
	take := func(list []string, want string) []string {
		i := 0
		for ; i < len(list) && len(out) < limit; i++ {
			e := q.cmds[list[i]]
			if e == nil || e.State != want {
				continue
			}
			e.State, e.Agent = Assigned, key
			e.Claims++
			out = append(out, e.Command)
		}
		return list[i:]
	}
	q.resend[key] = take(q.resend[key], Assigned)
	q.pending[key] = take(q.pending[key], Queued)
	return out, nil
}

// AckAll implements gateway.Queue.
func (q *Queue) AckAll(_ context.Context, a gateway.AgentRef, ids []string) (map[string]error, error) {
	refused := map[string]error{}
	if q.OnAck != nil {
		for _, id := range ids {
			if err := q.OnAck(id); err != nil {
				refused[id] = fmt.Errorf("command %s: %w: %w", id, err, gateway.ErrRejected)
			}
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ackCalls++
	for _, id := range ids {
		if refused[id] != nil {
			continue
		}
		e, err := q.ownedLocked(a, id)
		if err != nil {
			refused[id] = err
			continue
		}
		if q.LoseAck != nil && q.LoseAck(id) {
			continue
		}
		e.Acks++
		if e.State == Assigned {
			e.State = Delivered
		}
	}
	q.changedLocked()
	return refused, nil
}

func (q *Queue) ownedLocked(a gateway.AgentRef, id string) (*Entry, error) {
	e, ok := q.cmds[id]
	if !ok {
		return nil, fmt.Errorf("command %s: unknown: %w", id, gateway.ErrRejected)
	}
	if e.Agent != AgentKey(a) {
		return nil, fmt.Errorf("command %s is not assigned to %s: %w", id, a, gateway.ErrRejected)
	}
	return e, nil
}

// Update implements gateway.Queue.
func (q *Queue) Update(_ context.Context, a gateway.AgentRef, u gateway.Update) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	e, err := q.ownedLocked(a, u.CommandID)
	if err != nil {
		return err
	}
	switch e.State {
	case Succeeded, Failed, Lost:
		if u.State == e.State {
			return nil // idempotent
		}
		return fmt.Errorf("command %s is %s, cannot become %s: %w", u.CommandID, e.State, u.State, gateway.ErrRejected)
	}
	e.Updates = append(e.Updates, u)
	e.State = u.State
	if u.Final() {
		e.Final = u
		q.finals++
	}
	q.changedLocked()
	return nil
}

// Notify implements gateway.Queue.
func (q *Queue) Notify(a gateway.AgentRef) (<-chan struct{}, func()) {
	key := AgentKey(a)
	ch := make(chan struct{}, 1)
	q.mu.Lock()
	defer q.mu.Unlock()
	id := q.nextSub
	q.nextSub++
	if q.subs[key] == nil {
		q.subs[key] = map[int]chan struct{}{}
	}
	q.subs[key][id] = ch
	return ch, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		delete(q.subs[key], id)
	}
}

// Connected implements gateway.Queue: the agent's assigned-unacknowledged commands are due again.
func (q *Queue) Connected(_ context.Context, a gateway.AgentRef, h gateway.Hello) error {
	if q.OnConnect != nil {
		if err := q.OnConnect(h); err != nil {
			return err
		}
	}
	key := AgentKey(a)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.connected[key]++
	q.open[key]++
	q.hellos = append(q.hellos, h)
	var due []string
	for id, e := range q.cmds {
		if e.Agent == key && e.State == Assigned {
			due = append(due, id)
		}
	}
	slices.Sort(due)
	q.resend[key] = due
	q.changedLocked()
	return nil
}

// Disconnected implements gateway.Queue.
func (q *Queue) Disconnected(_ context.Context, a gateway.AgentRef) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.open[AgentKey(a)]--
	q.changedLocked()
	return nil
}

// Status implements gateway.Queue.
func (q *Queue) Status(_ context.Context, a gateway.AgentRef, s gateway.Status) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := AgentKey(a)
	q.statuses[key] = append(q.statuses[key], s)
	q.changedLocked()
	return nil
}

// Cancels implements gateway.Canceller.
func (q *Queue) Cancels(_ context.Context, a gateway.AgentRef) ([]string, error) {
	key := AgentKey(a)
	q.mu.Lock()
	defer q.mu.Unlock()
	var ids []string
	for id := range q.cancelled {
		e := q.cmds[id]
		switch {
		case e.State == Succeeded || e.State == Failed:
			delete(q.cancelled, id)
		case e.Agent == key:
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// Get returns a copy of a command's entry.
func (q *Queue) Get(id string) (Entry, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e, ok := q.cmds[id]
	if !ok {
		return Entry{}, false
	}
	c := *e
	c.Updates = slices.Clone(e.Updates)
	return c, true
}

// Counts is a snapshot of the queue's counters.
type Counts struct {
	Final     int            // commands succeeded or failed
	Acks      int            // acknowledgements recorded
	AckCalls  int            // AckAll calls (one per frame and lane)
	Connected map[string]int // Connected calls per agent key
	Open      map[string]int // streams open per agent key
	Statuses  map[string]int // status reports per agent key
	Hellos    []gateway.Hello
}

// Counts returns the counters now.
func (q *Queue) Counts() Counts {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.countsLocked()
}

func (q *Queue) countsLocked() Counts {
	c := Counts{Final: q.finals, AckCalls: q.ackCalls, Connected: map[string]int{}, Open: map[string]int{}, Statuses: map[string]int{}, Hellos: slices.Clone(q.hellos)}
	for _, e := range q.cmds {
		c.Acks += e.Acks
	}
	for k, v := range q.connected {
		c.Connected[k] = v
	}
	for k, v := range q.open {
		c.Open[k] = v
	}
	for k, v := range q.statuses {
		c.Statuses[k] = len(v)
	}
	return c
}

// Statuses returns the status reports of an agent.
func (q *Queue) Statuses(a gateway.AgentRef) []gateway.Status {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.statuses[AgentKey(a)])
}

// WaitFor blocks until cond holds for the counters or ctx ends.
func (q *Queue) WaitFor(ctx context.Context, cond func(Counts) bool) error {
	for {
		q.mu.Lock()
		ok := cond(q.countsLocked())
		ch := q.changed
		q.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting on the fake queue: %w", ctx.Err())
		}
	}
}
