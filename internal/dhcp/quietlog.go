package dhcp

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// quietInterval spaces the log lines a packet flood could repeat (see quietLog).
const quietInterval = time.Minute

// quietLog lets one log line per key through per quietInterval and counts those it holds back,
// so that a host on the provisioning network sending packets in a loop (made-up MACs that
// exhaust a pool, a firmware retrying forever) cannot flood the agent's log: the next line let
// through says how many were held back (held_back). Keys are fixed strings of this package
// (per message, per pool), never packet data, so the table stays small.
type quietLog struct {
	mu   sync.Mutex
	keys map[string]*quietWindow
}

type quietWindow struct {
	last time.Time
	held int
}

// log logs msg at level unless a line for key went out less than quietInterval before now.
func (q *quietLog) log(ctx context.Context, l *slog.Logger, level slog.Level, now time.Time, key, msg string, attrs ...any) {
	q.mu.Lock()
	if q.keys == nil {
		q.keys = map[string]*quietWindow{}
	}
	w := q.keys[key]
	held := 0
	switch {
	case w == nil:
		q.keys[key] = &quietWindow{last: now}
	case now.Sub(w.last) < quietInterval && !now.Before(w.last):
		w.held++
		q.mu.Unlock()
		return
	default:
		held, w.held, w.last = w.held, 0, now
	}
	q.mu.Unlock()
	l.Log(ctx, level, msg, append(attrs, "held_back", held)...)
}
