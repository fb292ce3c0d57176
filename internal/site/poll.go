package site

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"bcd/internal/bmc"
)

// PowerReporter receives power changes the poller observed (and each node's first reading).
// The control plane backs it; it must not block for long.
type PowerReporter interface {
	ReportPower(ctx context.Context, nodeID string, power bmc.PowerState) error
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
	nodeID string
	ref    BMCRef
	jwe    string
	next   time.Time
	last   bmc.PowerState
	busy   bool // a read runs
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
	fails   map[string]int         // BMC key → consecutive failures
	wake    chan struct{}
}

func newPoller(cfg PollConfig, probe powerProbe, locks *bmcLocks, r PowerReporter, log *slog.Logger, now func() time.Time) *poller {
	return &poller{cfg: cfg.withDefaults(), probe: probe, locks: locks, reporter: r, log: log, now: now, rnd: rand.Float64,
		targets: map[string]*pollTarget{}, fails: map[string]int{}, wake: make(chan struct{}, 1)}
}

// Watch starts (or refreshes) polling of node with the binding and credentials of its latest
// BMC command. The first read comes after a jittered fraction of the interval, so that many
// nodes watched at once do not read together.
func (p *poller) Watch(nodeID string, ref BMCRef, jwe string) {
	p.mu.Lock()
	t, ok := p.targets[nodeID]
	if !ok {
		t = &pollTarget{nodeID: nodeID, next: p.now().Add(time.Duration(p.rnd() * float64(p.cfg.Interval)))}
		p.targets[nodeID] = t
	}
	t.ref, t.jwe = ref, jwe
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

// dispatch starts the due reads that have a free slot and returns the next due time.
func (p *poller) dispatch(ctx context.Context, sem chan struct{}, wg *sync.WaitGroup) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for _, t := range p.targets {
		if t.busy || t.next.After(now) {
			continue
		}
		key := bmcKey(t.ref.Driver, t.ref.Address)
		release, ok := p.locks.TryLock(key)
		if !ok {
			t.next = now.Add(p.cfg.RetryBusy)
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			release()
			t.next = now.Add(p.cfg.RetryBusy)
			continue
		}
		t.busy = true
		nodeID, ref, jwe := t.nodeID, t.ref, t.jwe
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			power, err := p.probe(ctx, ref, jwe)
			release()
			p.done(ctx, nodeID, key, power, err)
		}()
	}
	var next time.Time
	for _, t := range p.targets {
		if !t.busy && (next.IsZero() || t.next.Before(next)) {
			next = t.next
		}
	}
	return next
}

// done records a read: the BMC's failure count, the node's next read, and a report when the
// power changed.
func (p *poller) done(ctx context.Context, nodeID, key string, power bmc.PowerState, err error) {
	p.mu.Lock()
	if err != nil {
		p.fails[key]++
	} else {
		delete(p.fails, key)
	}
	fails := p.fails[key]
	t, ok := p.targets[nodeID]
	changed := false
	if ok {
		t.busy = false
		t.next = p.now().Add(pollDelay(p.cfg.Interval, p.cfg.MaxInterval, fails, p.cfg.Jitter, p.rnd()))
		if err == nil && power != t.last {
			t.last, changed = power, true
		}
	}
	p.mu.Unlock()
	p.poke()
	switch {
	case err != nil && ctx.Err() == nil:
		p.log.WarnContext(ctx, "power poll failed", "node", nodeID, "bmc", key, "failures", fails, "err", err)
	case changed:
		if rerr := p.reporter.ReportPower(ctx, nodeID, power); rerr != nil {
			p.log.WarnContext(ctx, "reporting power", "node", nodeID, "err", rerr)
		}
	}
}
