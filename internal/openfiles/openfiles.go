// Package openfiles is the process's limit on open files (RLIMIT_NOFILE): read, and raised to
// a need known in advance, with an error that says what was needed and what the limit allows.
package openfiles

import (
	"context"
	"fmt"
	"log/slog"
)

// Limit is a process's soft limit on open files (what it may open now) and its hard limit
// (what an unprivileged process may raise the soft one to).
type Limit struct{ Soft, Hard uint64 }

// plan is the limit to set so that need files may be open, from the current one: the soft limit
// raised to need, the hard one too when it is below (which only a privileged process may do).
// change is false when the current limit already allows need. Pure.
func plan(cur Limit, need uint64) (next Limit, change bool) {
	if cur.Soft >= need {
		return cur, false
	}
	return Limit{Soft: need, Hard: max(cur.Hard, need)}, true
}

// Ensure makes sure this process may hold need open files, raising its limit if it must. The
// error says what was needed and what the limit is when it cannot (a hard limit below need in
// an unprivileged process, or above the kernel's ceiling, /proc/sys/fs/nr_open).
func Ensure(ctx context.Context, log *slog.Logger, need uint64) (Limit, error) {
	cur, err := get()
	if err != nil {
		return Limit{}, fmt.Errorf("reading the limit on open files: %w", err)
	}
	next, change := plan(cur, need)
	if !change {
		return cur, nil
	}
	if err := set(next); err != nil {
		return cur, fmt.Errorf("about %d open files are needed and this process may hold %d (ulimit -n; hard limit %d); raising it failed: %w",
			need, cur.Soft, cur.Hard, err)
	}
	log.LogAttrs(ctx, slog.LevelInfo, "raised the limit on open files",
		slog.Uint64("from", cur.Soft), slog.Uint64("to", next.Soft), slog.Uint64("hard", next.Hard))
	return next, nil
}
