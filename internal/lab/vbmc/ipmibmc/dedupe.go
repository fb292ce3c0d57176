package ipmibmc

import (
	"context"
	"sync"
	"time"

	"github.com/bougou/go-ipmi/pkg/handlers"
	"github.com/bougou/go-ipmi/pkg/types"
)

// dedupe answers a repeated, identical non-idempotent command of one session from cache.
//
// IPMI clients retransmit a request after ~1 s without answer; ipmitool rebuilds it with a new
// session sequence number but the same content, go-ipmi resends the same bytes. Either way the
// BMC sees the same command twice in one session, and must not power-cycle twice (LAB-NOTES
// gotcha 4). A new session is never deduplicated: a fresh "cycle" from a new login runs.
type dedupe struct {
	window time.Duration // <0: off
	now    func() time.Time

	mu      sync.Mutex
	entries map[dedupeKey]dedupeEntry
}

type dedupeKey struct {
	session    uint32
	netFn, cmd uint8
	data       string
}

type dedupeEntry struct {
	at   time.Time
	resp []byte
}

func newDedupe(window time.Duration, now func() time.Time) *dedupe {
	return &dedupe{window: window, now: now, entries: map[dedupeKey]dedupeEntry{}}
}

// deduped lists the commands whose repetition would do harm.
func deduped(c types.Command) bool {
	return c.NetFn == types.CommandChassisControl.NetFn && c.ID == types.CommandChassisControl.ID
}

// seen reports the cached answer of key if it was stored less than window ago, and drops
// expired entries.
func (d *dedupe) seen(key dedupeKey) ([]byte, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	for k, e := range d.entries {
		if now.Sub(e.at) >= d.window {
			delete(d.entries, k)
		}
	}
	e, ok := d.entries[key]
	return e.resp, ok
}

func (d *dedupe) remember(key dedupeKey, resp []byte) {
	d.mu.Lock()
	d.entries[key] = dedupeEntry{at: d.now(), resp: append([]byte(nil), resp...)}
	d.mu.Unlock()
}

func (d *dedupe) middleware(b *BMC) handlers.Middleware {
	return func(next handlers.Handler) handlers.Handler {
		return handlers.HandlerFunc(func(ctx context.Context, hctx *handlers.HandlerContext, req []byte) ([]byte, types.CompletionCode, error) {
			if hctx == nil || hctx.Session == nil || !deduped(hctx.Command) {
				return next.Handle(ctx, hctx, req)
			}
			b.arrivals.Add(1)
			if d.window < 0 {
				return next.Handle(ctx, hctx, req)
			}
			key := dedupeKey{session: hctx.Session.BMCID, netFn: uint8(hctx.Command.NetFn), cmd: hctx.Command.ID, data: string(req)}
			if resp, ok := d.seen(key); ok {
				b.log.Info("repeated command in the same session answered from cache, not run again",
					"command", hctx.Command.Name, "session", hctx.Session.BMCID)
				return resp, types.CodeOK, nil
			}
			resp, cc, err := next.Handle(ctx, hctx, req)
			if err == nil && cc == types.CodeOK {
				d.remember(key, resp)
			}
			return resp, cc, err
		})
	}
}
