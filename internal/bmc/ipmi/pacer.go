package ipmi

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Pacer defaults: one session per BMC at a time, 100 ms between two commands to one BMC. BMCs
// are small embedded systems; many of them drop sessions or answer garbage when driven faster.
const (
	DefaultMaxSessions = 1
	DefaultMinInterval = 100 * time.Millisecond
)

// PacerConfig sets the per-BMC limits.
type PacerConfig struct {
	MaxSessions int           // concurrent sessions per BMC address; <= 0 means DefaultMaxSessions
	MinInterval time.Duration // between two commands to one BMC; 0 means DefaultMinInterval, < 0 none
}

// Pacer limits the sessions opened to, and the command rate sent to, each BMC address. One Pacer
// is shared by every IPMI client of a site agent so that concurrent workflows on one machine (or
// one multi-node chassis BMC) never storm its BMC. It is safe for concurrent use.
type Pacer struct {
	max      int
	interval time.Duration

	mu    sync.Mutex
	hosts map[string]*pacedHost
}

type pacedHost struct {
	sem  chan struct{} // one token per open session
	refs int           // goroutines using this entry; guarded by Pacer.mu

	mu   sync.Mutex
	next time.Time // earliest start of the next command
}

// NewPacer returns a Pacer with cfg's limits.
func NewPacer(cfg PacerConfig) *Pacer {
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = DefaultMaxSessions
	}
	switch {
	case cfg.MinInterval == 0:
		cfg.MinInterval = DefaultMinInterval
	case cfg.MinInterval < 0:
		cfg.MinInterval = 0
	}
	return &Pacer{max: cfg.MaxSessions, interval: cfg.MinInterval, hosts: map[string]*pacedHost{}}
}

// sweepAbove is the map size above which idle entries are dropped.
const sweepAbove = 256

func (p *Pacer) ref(addr string) *pacedHost {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.hosts) > sweepAbove {
		now := time.Now()
		for a, h := range p.hosts {
			if h.refs == 0 && h.idleSince(now) {
				delete(p.hosts, a)
			}
		}
	}
	h, ok := p.hosts[addr]
	if !ok {
		h = &pacedHost{sem: make(chan struct{}, p.max)}
		p.hosts[addr] = h
	}
	h.refs++
	return h
}

func (p *Pacer) unref(addr string, h *pacedHost) {
	p.mu.Lock()
	defer p.mu.Unlock()
	h.refs--
	if h.refs == 0 && h.idleSince(time.Now()) && p.hosts[addr] == h {
		delete(p.hosts, addr)
	}
}

func (h *pacedHost) idleSince(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.next.After(now)
}

// Acquire waits for a session slot on addr. The returned release must be called once the session
// is closed; calling it more than once is harmless.
func (p *Pacer) Acquire(ctx context.Context, addr string) (release func(), err error) {
	h := p.ref(addr)
	select {
	case h.sem <- struct{}{}:
	case <-ctx.Done():
		p.unref(addr, h)
		return nil, fmt.Errorf("waiting for a session slot on %s: %w", addr, ctx.Err())
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-h.sem
			p.unref(addr, h)
		})
	}, nil
}

// Wait returns when a command may be sent to addr: at least MinInterval after the previous one
// (reserved by an earlier Wait), or with ctx's error.
func (p *Pacer) Wait(ctx context.Context, addr string) error {
	if p.interval == 0 {
		return ctx.Err()
	}
	h := p.ref(addr)
	defer p.unref(addr, h)
	h.mu.Lock()
	now := time.Now()
	at := h.next
	if at.Before(now) {
		at = now
	}
	h.next = at.Add(p.interval)
	h.mu.Unlock()

	d := at.Sub(now)
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("pacing commands to %s: %w", addr, ctx.Err())
	}
}
