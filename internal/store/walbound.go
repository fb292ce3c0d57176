package store

import (
	"log/slog"
	"time"
)

// walBound is what the writer knows, between two groups, about bringing the WAL back under its
// limit (walLimit). Passive checkpoints (checkpointLoop) copy the WAL into the database file
// beside the writer but never catch up with a writer that does not pause, and SQLite begins the
// WAL again only once all of it is copied. Once the WAL is over its limit the writer:
//
//  1. asks the checkpointer to catch up with it at once (walAsk: passes one after the other
//     until one finds little added since the last), and goes on with its groups;
//  2. then copies what is left, on its own connection and without waiting for readers
//     (walBackfill): when that copied all of it, SQLite restarts the WAL at the next group's
//     first write, unless a reader is still reading frames of it, and the commit after cuts
//     the file back to the limit (journal_size_limit);
//  3. after walBackfills such tries the WAL still over its limit, restarts it waiting for the
//     readers (walRestart, restartWAL), as every restart did before: SQLite's busy handler
//     sleeps the writer between its looks at the readers (about 60 ms a restart at 3 000
//     simulated nodes).
type walBound struct {
	over      bool      // over the limit at the last look
	asked     bool      // the checkpointer was asked to catch up,
	askedAt   time.Time // then,
	catchUps  int64     // when it had caught up this many times
	backfills int       // the writer's own copies since the WAL went over
	retry     time.Time // a restart that waited failed: the next not before then
	backoff   time.Duration
	looked    time.Time // the WAL file's size was last read then (under the limit)
}

// walLookEvery is how often the writer reads the WAL file's size while it is under its limit
// (a stat, about 18 µs in a virtual machine, was 1 % of the writer's time before every group):
// it grows by a few hundred KiB a group, a few MiB in walLookEvery at most.
const walLookEvery = 10 * time.Millisecond

// look says whether the writer reads the WAL file's size before a group at now: always while
// it is over its limit (each group's step depends on it), else every walLookEvery. Pure.
func (w walBound) look(now time.Time) bool {
	return w.over || w.looked.IsZero() || now.Sub(w.looked) >= walLookEvery || now.Before(w.looked)
}

// walAction is what the writer does about the WAL before a group.
type walAction int

const (
	walNothing walAction = iota
	walAsk
	walBackfill
	walRestart
)

// walBackfills is how many times the writer copies what is left of the WAL and lets SQLite
// restart it before it restarts it waiting for readers; walAskWait the longest it waits for the
// checkpointer to catch up.
const (
	walBackfills = 16
	walAskWait   = time.Second
)

// next is what the writer does before a group, the WAL over its limit or not (over), at now,
// the checkpointer having caught up catchUps times. Pure.
func (w walBound) next(over bool, now time.Time, catchUps int64) walAction {
	switch {
	case !over || now.Before(w.retry):
		return walNothing
	case !w.asked:
		return walAsk
	case catchUps == w.catchUps && now.Sub(w.askedAt) < walAskWait:
		return walNothing // (the checkpointer is catching up)
	case w.backfills < walBackfills:
		return walBackfill
	default:
		return walRestart
	}
}

// boundWAL does before a group what w says about the WAL, and keeps w.
func (s *Store) boundWAL(w *walBound, now time.Time) {
	if !w.look(now) {
		return
	}
	over := s.walOverLimit()
	if !over {
		if w.over {
			s.walRestarts.Add(1) // (back under its limit: restarted)
		}
		*w = walBound{retry: w.retry, backoff: w.backoff, looked: now}
		return
	}
	w.over = true
	catchUps := s.ckptCatchUps.Load()
	switch w.next(true, now, catchUps) {
	case walAsk:
		w.asked, w.askedAt, w.catchUps = true, now, catchUps
		select {
		case s.ckptNow <- struct{}{}:
		default: // (asked already)
		}
	case walBackfill:
		w.backfills++
		s.backfillWAL()
	case walRestart:
		w.asked, w.backfills = false, 0
		if s.restartWAL() {
			s.walWaited.Add(1)
			w.backoff = 0
		} else {
			w.backoff = min(max(2*w.backoff, walRetryAfter), walRetryMax)
			w.retry = now.Add(w.backoff)
		}
	}
}

// backfillWAL copies what is left of the WAL into the database file on the writer's connection,
// between two groups, without waiting for readers (a passive checkpoint), unless the
// checkpointer is at it.
func (s *Store) backfillWAL() {
	if !s.ckptMu.TryLock() {
		return
	}
	defer s.ckptMu.Unlock()
	var busy, frames, copied int64
	if err := s.lite.queryRow("PRAGMA wal_checkpoint(PASSIVE)", nil).Scan(&busy, &frames, &copied); err != nil {
		// Not fatal: the WAL grows until a restart that waits for readers.
		slog.Default().Warn("copying the store's write-ahead log into the database", "error", err)
	}
}
