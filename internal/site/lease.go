package site

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Lease is the site's boot lease as the holder side needs it: one agent per site holds it;
// Acquire takes it or renews it for ttl when agent holds it or nobody does (or the holder let
// it expire), and answers false while another agent's lease runs. The control plane backs it
// with its store (DESIGN §3 `leases`); MemoryLease is the in-process fake.
type Lease interface {
	Acquire(ctx context.Context, site, agent string, ttl time.Duration) (held bool, err error)
}

// leaseReleaser is implemented by leases that can be handed back on a clean shutdown, so that
// another agent takes over at once instead of after the TTL.
type leaseReleaser interface {
	Release(ctx context.Context, site, agent string) error
}

// MemoryLease is an in-memory Lease shared by agents of one process (tests, `bcd server` with
// an embedded site). Safe for concurrent use.
type MemoryLease struct {
	now func() time.Time

	mu     sync.Mutex
	holder map[string]memoryHold // site → hold
}

type memoryHold struct {
	agent   string
	expires time.Time
}

// NewMemoryLease returns an empty lease table; now is the clock (nil: time.Now).
func NewMemoryLease(now func() time.Time) *MemoryLease {
	if now == nil {
		now = time.Now
	}
	return &MemoryLease{now: now, holder: map[string]memoryHold{}}
}

// Acquire implements Lease.
func (m *MemoryLease) Acquire(ctx context.Context, site, agent string, ttl time.Duration) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("acquiring boot lease of site %s: %w", site, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	h, ok := m.holder[site]
	if ok && h.agent != agent && now.Before(h.expires) {
		return false, nil
	}
	m.holder[site] = memoryHold{agent: agent, expires: now.Add(ttl)}
	return true, nil
}

// Release implements leaseReleaser: agent hands the lease back if it holds it.
func (m *MemoryLease) Release(_ context.Context, site, agent string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if h, ok := m.holder[site]; ok && h.agent == agent {
		delete(m.holder, site)
	}
	return nil
}

// Holder returns the site's current holder ("" when none holds an unexpired lease).
func (m *MemoryLease) Holder(site string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.holder[site]
	if !ok || !m.now().Before(h.expires) {
		return ""
	}
	return h.agent
}

// leaseOutcome is the result of one Acquire call.
type leaseOutcome int

const (
	leaseHeld   leaseOutcome = iota // renewed or taken
	leaseLost                       // another agent holds it
	leaseFailed                     // the lease store did not answer
)

// nextHeldUntil decides until when the agent may serve after an Acquire that started at
// `start`: a renewal extends to start+ttl (the store's expiry is later than that, since it
// counts from when it wrote); a refusal ends serving at once; an error keeps the previous
// deadline, so a holder that cannot reach the store stops before another can take over. Pure.
func nextHeldUntil(prev, start time.Time, ttl time.Duration, o leaseOutcome) time.Time {
	switch o {
	case leaseHeld:
		return start.Add(ttl)
	case leaseLost:
		return time.Time{}
	default:
		return prev
	}
}

// holdState is the agent's view of the boot lease: it may serve while now < until. Readers
// wait on changed() for transitions. Safe for concurrent use.
type holdState struct {
	now func() time.Time

	mu      sync.Mutex
	until   time.Time
	changes chan struct{} // closed and replaced when until moves
}

func newHoldState(now func() time.Time) *holdState {
	return &holdState{now: now, changes: make(chan struct{})}
}

// Held reports whether the agent holds the lease now.
func (h *holdState) Held() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.now().Before(h.until)
}

// Until is the end of the current hold (zero when none).
func (h *holdState) Until() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.until
}

func (h *holdState) set(until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if until.Equal(h.until) {
		return
	}
	h.until = until
	close(h.changes)
	h.changes = make(chan struct{})
}

func (h *holdState) changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changes
}

// leaseLoop acquires and renews the boot lease every ttl/3 until ctx ends, then releases it
// when the lease supports that.
func leaseLoop(ctx context.Context, l Lease, site, agent string, ttl time.Duration, st *holdState, log *slog.Logger) {
	every := ttl / 3
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			st.set(time.Time{})
			if r, ok := l.(leaseReleaser); ok {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), every)
				if err := r.Release(rctx, site, agent); err != nil {
					log.Warn("releasing the boot lease", "site", site, "err", err)
				}
				cancel()
			}
			return
		case <-t.C:
		}
		start := st.now()
		actx, cancel := context.WithTimeout(ctx, every)
		held, err := l.Acquire(actx, site, agent, ttl)
		cancel()
		o := leaseLost
		switch {
		case err != nil:
			o = leaseFailed
		case held:
			o = leaseHeld
		}
		before := st.Held()
		st.set(nextHeldUntil(st.Until(), start, ttl, o))
		switch after := st.Held(); {
		case err != nil && ctx.Err() == nil:
			log.Warn("boot lease store did not answer", "site", site, "held_until", st.Until(), "err", err)
		case after && !before:
			log.Info("boot lease acquired: serving DHCP and boot scripts", "site", site, "agent", agent)
		case !after && before:
			log.Info("boot lease lost: stopped serving", "site", site, "agent", agent)
		}
		t.Reset(every)
	}
}
