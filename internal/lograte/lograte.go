// Package lograte keeps what anyone on a network can make a server say from flooding its log:
// one line per key and interval, the next line let through saying how many were held back.
package lograte

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// HeldBack is the attribute Log adds to each line: the lines of its key held back since the
// last one let through.
const HeldBack = "held_back"

// Limiter lets one log line per key through per interval and counts the ones it holds back. It
// keeps at most maxKeys keys: a full table is emptied, which only lets lines through early.
type Limiter struct {
	interval time.Duration
	maxKeys  int

	mu   sync.Mutex
	keys map[string]*window
}

type window struct {
	last time.Time // when a line was last let through
	held int       // lines held back since
}

// New returns a Limiter of one line per key and interval, for at most maxKeys keys.
func New(interval time.Duration, maxKeys int) *Limiter {
	return &Limiter{interval: interval, maxKeys: maxKeys, keys: map[string]*window{}}
}

// Allow says whether a line for key at now is logged, and how many lines for key were held
// back before it. A clock that went back lets the line through.
func (l *Limiter) Allow(key string, now time.Time) (ok bool, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.keys[key]
	if w == nil {
		if len(l.keys) >= l.maxKeys {
			l.keys = map[string]*window{}
		}
		l.keys[key] = &window{last: now}
		return true, 0
	}
	if d := now.Sub(w.last); d < l.interval && d >= 0 {
		w.held++
		return false, 0
	}
	held, w.held, w.last = w.held, 0, now
	return true, held
}

// Log logs msg at level with attrs and HeldBack, unless a line for key went out less than the
// interval before now.
func (l *Limiter) Log(ctx context.Context, log *slog.Logger, level slog.Level, now time.Time, key, msg string, attrs ...any) {
	if ok, held := l.Allow(key, now); ok {
		log.Log(ctx, level, msg, append(attrs, HeldBack, held)...)
	}
}
