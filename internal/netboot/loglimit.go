package netboot

import (
	"sync"
	"time"
)

// logLimiter lets one log line per key through per interval and counts the ones it held back, so
// that a host flooding the boot server with bad requests cannot flood the agent's log: the next
// line let through for the key says how many were held back. It keeps at most maxKeys keys (a
// full table is emptied, which only lets lines through early).
type logLimiter struct {
	interval time.Duration
	maxKeys  int

	mu   sync.Mutex
	keys map[string]*logWindow
}

type logWindow struct {
	last time.Time // when a line was last let through
	held int       // lines held back since
}

func newLogLimiter(interval time.Duration, maxKeys int) *logLimiter {
	return &logLimiter{interval: interval, maxKeys: maxKeys, keys: map[string]*logWindow{}}
}

// allow says whether a line for key at now is logged, and how many lines for key were held back
// before it.
func (l *logLimiter) allow(key string, now time.Time) (ok bool, held int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.keys[key]
	if w == nil {
		if len(l.keys) >= l.maxKeys {
			l.keys = map[string]*logWindow{}
		}
		l.keys[key] = &logWindow{last: now}
		return true, 0
	}
	if now.Sub(w.last) < l.interval {
		w.held++
		return false, 0
	}
	held, w.held, w.last = w.held, 0, now
	return true, held
}
