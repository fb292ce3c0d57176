package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// What the writer does about the WAL before a group, for each state it can be in.
func TestWALBoundDecides(t *testing.T) {
	t0 := time.Unix(1000, 0)
	asked := walBound{over: true, asked: true, askedAt: t0, catchUps: 3}
	for _, c := range []struct {
		name     string
		w        walBound
		over     bool
		now      time.Time
		catchUps int64
		want     walAction
	}{
		{"under the limit", walBound{}, false, t0, 0, walNothing},
		{"under the limit, asked before", asked, false, t0, 3, walNothing},
		{"over: ask the checkpointer to catch up", walBound{}, true, t0, 0, walAsk},
		{"over, after a restart that waited failed: not before the retry", walBound{retry: t0.Add(time.Second)}, true, t0, 0, walNothing},
		{"over, the retry's time come", walBound{retry: t0}, true, t0, 0, walAsk},
		{"asked, catching up", asked, true, t0.Add(walAskWait / 2), 3, walNothing},
		{"asked, caught up", asked, true, t0.Add(time.Millisecond), 4, walBackfill},
		{"asked, caught up twice meanwhile", asked, true, t0.Add(time.Millisecond), 5, walBackfill},
		{"asked, not caught up within walAskWait", asked, true, t0.Add(walAskWait), 3, walBackfill},
		{"copied what was left before, not restarted yet", walBound{over: true, asked: true, askedAt: t0, catchUps: 3, backfills: walBackfills - 1}, true, t0, 4, walBackfill},
		{"copied what was left walBackfills times: wait for the readers", walBound{over: true, asked: true, askedAt: t0, catchUps: 3, backfills: walBackfills}, true, t0, 4, walRestart},
	} {
		if got := c.w.next(c.over, c.now, c.catchUps); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// With no reader in the WAL, the writer never waits to restart it: the checkpointer catches up,
// the writer copies what is left, and SQLite begins the WAL again at the next group's write.
// A restart can take up to walAskWait (the checkpointer catching up) while the writes go on: the
// bound on writes leaves room for several such waits on a busy machine. Every write changes its
// row: one that rewrites what a row holds writes no page, and SQLite begins the WAL again only
// at a commit that writes one (TestWALComesBackUnderItsLimitWhenWritesChangeNothing). This
// test's writes once did, and the WAL then restarted twice, in CI and here, whenever its third
// restart came after the first 200 writes.
func TestWALRestartsWithoutWaitingWhenNoReaderIsInIt(t *testing.T) {
	ctx := context.Background()
	s, _ := walTestStore(t, 1<<20)
	for i := 0; s.WriterStats().WALRestarts < 3; i++ {
		if i == 40000 {
			t.Fatalf("the WAL restarted %d times in %d writes of 8 KiB (limit 1 MiB)", s.WriterStats().WALRestarts, i)
		}
		if err := walTestWrite(ctx, s, i%200, walTestBody(i)); err != nil {
			t.Fatal(err)
		}
	}
	if st := s.WriterStats(); st.WALRestartsWaited != 0 {
		t.Errorf("%d of %d restarts waited for readers; no reader was in the WAL", st.WALRestartsWaited, st.WALRestarts)
	}
}

// TestWALSizeLookedAtEveryFewMilliseconds: under its limit the WAL file's size is read at most
// every walLookEvery; over it, before every group (and at the first group, and if the clock
// went back).
func TestWALSizeLookedAtEveryFewMilliseconds(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		name string
		w    walBound
		now  time.Time
		want bool
	}{
		{"never looked", walBound{}, t0, true},
		{"looked just now, under", walBound{looked: t0}, t0.Add(time.Millisecond), false},
		{"looked a while ago, under", walBound{looked: t0}, t0.Add(walLookEvery), true},
		{"over: every group", walBound{over: true, looked: t0}, t0.Add(time.Millisecond), true},
		{"the clock went back", walBound{looked: t0}, t0.Add(-time.Second), true},
	} {
		if got := c.w.look(c.now); got != c.want {
			t.Errorf("%s: look %v, want %v", c.name, got, c.want)
		}
	}
}

// walTestBody is the i-th write's body: 8 KiB that begin with i, so no two writes' are alike.
func walTestBody(i int) string { return fmt.Sprintf("%08d", i) + strings.Repeat("x", 8192-8) }

// walTestWrite sets row id of walTestStore's table to body, in a write of its own.
func walTestWrite(ctx context.Context, s *Store, id int, body string) error {
	return s.Write(ctx, func(tx *Tx) error {
		_, err := tx.exec(ctx, "INSERT INTO wal_test (id, body) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET body = excluded.body", id, body)
		return err
	})
}

// A WAL over its limit comes back under it even when no write after that changes a page:
// SQLite begins the WAL again, and cuts its file back, only at a commit that writes a page, so
// the writer's last resort (restartWAL) empties the file itself. Before, it copied and
// restarted the WAL again every few groups for as long as the writes changed nothing (the
// file's size never fell), and a test whose writes rewrote their rows as they were saw the WAL
// stay over its limit for good, now and then.
func TestWALComesBackUnderItsLimitWhenWritesChangeNothing(t *testing.T) {
	ctx := context.Background()
	s, _ := walTestStore(t, 1<<20)
	// held is what each row holds.
	var held [200]string
	for i := 0; i < len(held) || !s.walOverLimit(); i++ { // (every row written, the WAL over its limit)
		if i == 40000 {
			t.Fatalf("the WAL did not pass its limit in %d writes of 8 KiB", i)
		}
		held[i%len(held)] = walTestBody(i)
		if err := walTestWrite(ctx, s, i%len(held), held[i%len(held)]); err != nil {
			t.Fatal(err)
		}
	}
	// rewrite writes a row again as it is.
	rewrite := func(writes int) {
		t.Helper()
		id := writes % len(held)
		if err := walTestWrite(ctx, s, id, held[id]); err != nil {
			t.Fatal(err)
		}
	}
	pages, restarts := s.WriterStats().WALPages, s.WriterStats().WALRestarts
	deadline := time.Now().Add(30 * time.Second)
	writes := 0
	for ; s.walOverLimit(); writes++ {
		if time.Now().After(deadline) {
			st := s.WriterStats()
			t.Fatalf("the WAL stayed over its limit through %d writes that changed nothing (%d restarts that waited for readers)", writes, st.WALRestartsWaited)
		}
		rewrite(writes)
	}
	st := s.WriterStats()
	if st.WALPages != pages {
		t.Fatalf("the writes that rewrote rows as they were wrote %d pages to the WAL: this test needs writes that change nothing", st.WALPages-pages)
	}
	// (Counted at the writer's next look at the file, before a group.)
	for ; s.WriterStats().WALRestarts == restarts; writes++ {
		if time.Now().After(deadline) {
			t.Fatalf("the WAL came back under its limit but no restart was counted")
		}
		rewrite(writes)
	}
	t.Logf("back under the limit after %d writes that changed nothing", writes)
}
