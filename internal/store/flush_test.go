package store

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// openFlushTest opens a SQLite store with a table of ids to write.
func openFlushTest(t *testing.T) *Store {
	t.Helper()
	ctx := context.Background()
	s := openTempSQLite(t)
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.exec(ctx, `CREATE TABLE flushed (id INTEGER PRIMARY KEY)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return s
}

// insertReq is a write of id into flushed, handed to the writer as Write does.
func insertReq(s *Store, id int, ran *atomic.Int32) *writeReq {
	req := &writeReq{ctx: context.Background(), done: make(chan error, 1), f: func(tx *Tx) error {
		if ran != nil {
			ran.Add(1)
		}
		_, err := tx.exec(context.Background(), `INSERT INTO flushed (id) VALUES (?)`, id)
		return err
	}}
	s.writes <- req
	return req
}

func flushedIDs(t *testing.T, s *Store) []int {
	t.Helper()
	ctx := context.Background()
	rows, err := s.queryRows(ctx, `SELECT id FROM flushed ORDER BY id`)
	ids, err := collect(rows, err, "ids", func(r interface{ Scan(...any) error }) (int, error) {
		var id int
		return id, r.Scan(&id)
	})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// SQLite's writer commits without waiting for the disk and goes on with the next group; a
// write's caller is answered only once the WAL holding its commit has been flushed to disk.
func TestWriteIsAnsweredOnceItsCommitIsOnDisk(t *testing.T) {
	s := openFlushTest(t)
	entered, release := make(chan struct{}, 4), make(chan struct{})
	var hold atomic.Bool
	hold.Store(true)
	sync := func(f *os.File) error {
		if hold.Load() {
			entered <- struct{}{}
			<-release
		}
		return fdatasync(f)
	}
	s.syncWAL.Store(&sync)
	var released atomic.Bool
	unblock := func() {
		hold.Store(false)
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}
	t.Cleanup(unblock) // (before the store closes, should the test end early)
	before := s.WriterStats().Flushes

	first := insertReq(s, 1, nil)
	<-entered // the flush of the first write's commit has begun, and waits
	if len(first.done) != 0 {
		t.Fatal("the write was answered before its commit was flushed to disk")
	}
	if got := flushedIDs(t, s); !slices.Equal(got, []int{1}) {
		t.Fatalf("readers see %v while the commit is being flushed, want [1] (committed)", got)
	}
	// The writer does not wait for the flush: the next write commits meanwhile.
	second := insertReq(s, 2, nil)
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(flushedIDs(t, s), []int{1, 2}) {
		if time.Now().After(deadline) {
			t.Fatal("the writer did not commit the next write while a flush was under way")
		}
		time.Sleep(time.Millisecond)
	}
	if len(first.done) != 0 || len(second.done) != 0 {
		t.Fatal("a write was answered before its commit was flushed to disk")
	}
	unblock()
	for i, req := range []*writeReq{first, second} {
		if err := <-req.done; err != nil {
			t.Errorf("write %d: %v", i+1, err)
		}
	}
	if got := s.WriterStats().Flushes - before; got != 2 {
		t.Errorf("%d flushes, want 2 (one per commit: the second was committed during the first's flush)", got)
	}
}

// A flush that fails fails the writes it held, and the store refuses every write after it
// without running it: what the disk holds is unknown until the store is reopened.
func TestAFailedFlushFailsItsWritesAndTheWritesAfter(t *testing.T) {
	s := openFlushTest(t)
	eio := errors.New("input/output error")
	sync := func(*os.File) error { return eio }
	s.syncWAL.Store(&sync)

	var ran atomic.Int32
	err := <-insertReq(s, 1, &ran).done
	if !errors.Is(err, eio) || !strings.Contains(err.Error(), "flushing the SQLite store's write-ahead log to disk") {
		t.Fatalf("the write whose flush failed: %v, want the flush's error", err)
	}
	if err := s.Write(context.Background(), func(tx *Tx) error {
		ran.Add(1)
		return nil
	}); !errors.Is(err, eio) {
		t.Fatalf("a write after the failed flush: %v, want the flush's error", err)
	}
	if got := ran.Load(); got != 1 {
		t.Errorf("write functions ran %d times, want 1 (none after the failed flush)", got)
	}
}
