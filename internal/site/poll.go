package site

import (
	"container/heap"
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"bcd/internal/bmc"
)

// PowerReading is what the poller reports about one read of a node's power.
type PowerReading struct {
	NodeID string
	Power  bmc.PowerState // "" when the read failed
	Err    error
	// Failures counts the consecutive failed reads of the node's BMC, this one included (0 when
	// it answered).
	Failures int
	At       time.Time
}

// PowerReporter receives the poller's readings: each node's first reading, every change, every
// failure, and the first success after failures (so that the control plane can clear
// BMC_UNREACHABLE). The control plane backs it; it must not block for long.
type PowerReporter interface {
	ReportPower(ctx context.Context, r PowerReading) error
}

// PollConfig tunes power-state polling. Zero values take the defaults.
type PollConfig struct {
	Interval    time.Duration // between two reads of one node when its BMC answers; default 60 s
	MaxInterval time.Duration // ceiling of the back-off of a failing BMC; default 10 min
	Jitter      float64       // ± fraction of each interval; default 0.2
	Parallel    int           // reads in flight across all BMCs; default 16
	// RetryBusy is the wait before a node whose BMC is busy (a command or another poll runs
	// on it) is tried again; default 2 s.
	RetryBusy time.Duration
	// Resync is how long an unchanged reading goes unreported at most: the control plane's
	// power axis may have been set meanwhile from a command's result; default 10 min.
	Resync time.Duration
}

func (c PollConfig) withDefaults() PollConfig {
	if c.Interval <= 0 {
		c.Interval = time.Minute
	}
	if c.MaxInterval < c.Interval {
		c.MaxInterval = max(10*time.Minute, c.Interval)
	}
	if c.Jitter <= 0 || c.Jitter >= 1 {
		c.Jitter = 0.2
	}
	if c.Parallel <= 0 {
		c.Parallel = 16
	}
	if c.RetryBusy <= 0 {
		c.RetryBusy = 2 * time.Second
	}
	if c.Resync <= 0 {
		c.Resync = 10 * time.Minute
	}
	return c
}

// pollDelay is the wait before the next read of a node whose BMC failed `fails` times in a
// row: interval doubled per failure up to ceiling, then spread by ±jitter with u in [0,1). Pure.
func pollDelay(interval, ceiling time.Duration, fails int, jitter, u float64) time.Duration {
	d := interval
	for i := 0; i < fails && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	return time.Duration(float64(d) * (1 + jitter*(2*u-1)))
}

// powerProbe reads a node's power with its BMC binding and its credentials (still encrypted to
// the agent; decrypted only for the call).
type powerProbe func(ctx context.Context, ref BMCRef, jwe string) (bmc.PowerState, error)

type pollTarget struct {
	nodeID  string
	ref     BMCRef
	jwe     string
	next    time.Time
	last    bmc.PowerState
	failing bool      // the last read failed
	sent    time.Time // last report
	seq     uint64    // bumped at each schedule: older queue items of the target are stale
	busy    bool      // a read runs
	fromSet bool      // listed by the control plane's poll set (SetTargets), not only watched
}

// poller polls the power of the nodes the agent ran BMC commands for: per node with jitter,
// with a back-off per BMC that grows while the BMC fails, never more than one call in flight
// per BMC (shared with commands through bmcLocks). Safe for concurrent use.
type poller struct {
	cfg      PollConfig
	probe    powerProbe
	locks    *bmcLocks
	reporter PowerReporter
	log      *slog.Logger
	now      func() time.Time
	rnd      func() float64

	mu      sync.Mutex
	targets map[string]*pollTarget // node → target
	due     dueQueue               // targets by next read (lazy: stale items are skipped)
	fails   map[string]int         // BMC key → consecutive failures
	wake    chan struct{}
	paused  bool // SetActive(false): no read starts
}

// dueItem is one scheduled read in the due queue.
type dueItem struct {
	at   time.Time
	node string
	seq  uint64
}

// dueQueue is a min-heap of scheduled reads (container/heap): dispatch looks only at what is
// due, so a completed read costs O(log n), not a pass over the site's nodes.
type dueQueue []dueItem

func (q dueQueue) Len() int           { return len(q) }
func (q dueQueue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q dueQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *dueQueue) Push(x any)        { *q = append(*q, x.(dueItem)) }
func (q *dueQueue) Pop() any {
	old := *q
	it := old[len(old)-1]
	*q = old[:len(old)-1]
	return it
}

func newPoller(cfg PollConfig, probe powerProbe, locks *bmcLocks, r PowerReporter, log *slog.Logger, now func() time.Time) *poller {
	return &poller{cfg: cfg.withDefaults(), probe: probe, locks: locks, reporter: r, log: log, now: now, rnd: rand.Float64,
		targets: map[string]*pollTarget{}, fails: map[string]int{}, wake: make(chan struct{}, 1)}
}

// scheduleLocked sets t's next read and queues it; the caller holds p.mu.
func (p *poller) scheduleLocked(t *pollTarget, at time.Time) {
	t.next = at
	t.seq++
	heap.Push(&p.due, dueItem{at: at, node: t.nodeID, seq: t.seq})
}

// addLocked creates node's target, first read after a jittered fraction of the interval.
func (p *poller) addLocked(nodeID string) *pollTarget {
	t := &pollTarget{nodeID: nodeID}
	p.targets[nodeID] = t
	p.scheduleLocked(t, p.now().Add(time.Duration(p.rnd()*float64(p.cfg.Interval))))
	return t
}

// topLocked drops stale items (targets gone, rescheduled or in flight) and returns the earliest
// live one.
func (p *poller) topLocked() (dueItem, *pollTarget, bool) {
	for p.due.Len() > 0 {
		it := p.due[0]
		if t, ok := p.targets[it.node]; ok && t.seq == it.seq && !t.busy {
			return it, t, true
		}
		heap.Pop(&p.due)
	}
	return dueItem{}, nil, false
}

// Watch starts (or refreshes) polling of node with the binding and credentials of its latest
// BMC command. The first read comes after a jittered fraction of the interval, so that many
// nodes watched at once do not read together.
func (p *poller) Watch(nodeID string, ref BMCRef, jwe string) {
	p.mu.Lock()
	t, ok := p.targets[nodeID]
	if !ok {
		t = p.addLocked(nodeID)
	}
	t.ref, t.jwe = ref, jwe
	p.mu.Unlock()
	p.poke()
}

// SetTarget is SetTargets' element: a node with its binding and encrypted credentials.
type SetTarget struct {
	NodeID string
	Ref    BMCRef
	JWE    string
}

// SetTargets makes ts the nodes listed by the control plane's poll set: new ones are read
// after a jittered fraction of the interval, listed ones get the new binding, nodes the
// previous set listed and ts does not are forgotten (nodes only watched are kept).
func (p *poller) SetTargets(ts []SetTarget) {
	p.mu.Lock()
	keep := make(map[string]bool, len(ts))
	for _, st := range ts {
		keep[st.NodeID] = true
		t, ok := p.targets[st.NodeID]
		if !ok {
			t = p.addLocked(st.NodeID)
		}
		t.ref, t.jwe, t.fromSet = st.Ref, st.JWE, true
	}
	for id, t := range p.targets {
		if t.fromSet && !keep[id] {
			delete(p.targets, id)
		}
	}
	p.mu.Unlock()
	p.poke()
}

// SetActive starts (true) or pauses (false) polling: only the boot-lease holder polls.
func (p *poller) SetActive(active bool) {
	p.mu.Lock()
	p.paused = !active
	p.mu.Unlock()
	p.poke()
}

// Forget stops polling node.
func (p *poller) Forget(nodeID string) {
	p.mu.Lock()
	delete(p.targets, nodeID)
	p.mu.Unlock()
}

func (p *poller) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run polls until ctx ends and waits for the reads in flight.
func (p *poller) Run(ctx context.Context) {
	sem := make(chan struct{}, p.cfg.Parallel)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		next := p.dispatch(ctx, sem, &wg)
		var wait <-chan time.Time
		var timer *time.Timer
		if !next.IsZero() {
			timer = time.NewTimer(max(next.Sub(p.now()), time.Millisecond))
			wait = timer.C
		}
		select {
		case <-ctx.Done():
		case <-p.wake:
		case <-wait:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// dispatch starts the due reads that have a free slot and returns the next due time (zero:
// nothing scheduled, or every slot taken: a finishing read pokes the loop).
func (p *poller) dispatch(ctx context.Context, sem chan struct{}, wg *sync.WaitGroup) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.paused {
		return time.Time{}
	}
	now := p.now()
	for {
		it, t, ok := p.topLocked()
		if !ok {
			return time.Time{}
		}
		if it.at.After(now) {
			return it.at
		}
		if len(sem) == cap(sem) {
			return time.Time{}
		}
		heap.Pop(&p.due)
		key := bmcKey(t.ref.Driver, t.ref.Address)
		release, ok := p.locks.TryLock(key)
		if !ok {
			p.scheduleLocked(t, now.Add(p.cfg.RetryBusy)) // a command (or another node's read) uses the BMC
			continue
		}
		sem <- struct{}{} // room checked above; only this goroutine adds
		t.busy = true
		t.seq++
		nodeID, ref, jwe := t.nodeID, t.ref, t.jwe
		wg.Add(1)
		go func() {
			defer wg.Done()
			power, err := p.probe(ctx, ref, jwe)
			release()
			// The slot is free before done pokes the loop: freed after, the loop could wake,
			// find every slot taken, and wait for a poke that never comes.
			<-sem
			p.done(ctx, nodeID, key, power, err)
		}()
	}
}

// done records a read: the BMC's failure count, the node's next read, and a report when the
// power changed, the read failed, or the BMC answers again after failing.
func (p *poller) done(ctx context.Context, nodeID, key string, power bmc.PowerState, err error) {
	p.mu.Lock()
	if err != nil {
		p.fails[key]++
	} else {
		delete(p.fails, key)
	}
	fails := p.fails[key]
	t, ok := p.targets[nodeID]
	report := false
	if ok && t.busy {
		t.busy = false
		p.scheduleLocked(t, p.now().Add(pollDelay(p.cfg.Interval, p.cfg.MaxInterval, fails, p.cfg.Jitter, p.rnd())))
		switch {
		case err != nil:
			t.failing, report = true, true
		case power != t.last || t.failing || p.now().Sub(t.sent) >= p.cfg.Resync:
			t.last, t.failing, report = power, false, true
		}
		if report {
			t.sent = p.now()
		}
	}
	p.mu.Unlock()
	p.poke()
	if err != nil && ctx.Err() == nil {
		p.log.WarnContext(ctx, "power poll failed", "node", nodeID, "bmc", shownBMCKey(key), "failures", fails, "err", err)
	} else {
		p.log.DebugContext(ctx, "power polled", "node", nodeID, "power", string(power), "report", report)
	}
	if !report || ctx.Err() != nil {
		return
	}
	r := PowerReading{NodeID: nodeID, Power: power, Err: err, Failures: fails, At: p.now()}
	if err != nil {
		r.Power = ""
	}
	if rerr := p.reporter.ReportPower(ctx, r); rerr != nil {
		p.log.WarnContext(ctx, "reporting power", "node", nodeID, "err", rerr)
	}
}
