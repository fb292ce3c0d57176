package store

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	rtrace "runtime/trace"
	"testing"
	"time"
)

// The writer's CPU time, while measured, is its own thread's, taken while it runs groups: some
// for groups that did work, never more than the time it was busy (a reading on another thread,
// or the process's CPU, would exceed it with the other goroutines' work).
func TestWriterCPUIsItsThreads(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the writer's thread CPU time is read on Linux")
	}
	ctx := context.Background()
	s := openTempSQLite(t)
	s.MeasureWriterCPU(true)
	before := s.WriterStats()
	// Other goroutines burn CPU meanwhile: none of it may count as the writer's.
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for x := 0; ; x++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = x * x
		}
	}()
	for i := 0; i < 200; i++ {
		if err := s.Write(ctx, func(tx *Tx) error {
			_, err := tx.InsertTenant(ctx, fmt.Sprintf("t%d", i))
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
	after := s.WriterStats()
	groups := after.Groups - before.Groups
	busy, cpu := after.Busy-before.Busy, after.CPU-before.CPU
	if groups < 1 || cpu <= 0 {
		t.Fatalf("%d groups took %s of the writer's CPU: want some", groups, cpu)
	}
	// Each group's two readings of the thread's clock lie at most a reading's time outside its
	// busy interval.
	if slack := time.Duration(groups) * 50 * time.Microsecond; cpu > busy+slack {
		t.Errorf("the writer used %s of CPU in %s busy (%d groups): more than it was busy", cpu, busy, groups)
	}
}

// The writer's CPU is counted only while it is measured (MeasureWriterCPU): not by default,
// then from the group after it is turned on, and no longer once it is turned off. Its busy time
// is counted throughout. (A group's counts are added just after its writes are handed to be
// answered: the last group measured may land after the writes that follow it began, so once
// measuring is off the CPU may still grow by that one group, a fiftieth of what 50 measured
// groups took.)
func TestWriterCPUOnlyWhileMeasured(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the writer's thread CPU time is read on Linux")
	}
	ctx := context.Background()
	s := openTempSQLite(t)
	// phase runs 50 writes, each a group of its own, and returns the writer's busy and CPU time
	// meanwhile.
	phase := func(name string) (busy, cpu time.Duration) {
		t.Helper()
		before := s.WriterStats()
		for i := range 50 {
			if err := s.Write(ctx, func(tx *Tx) error {
				_, err := tx.InsertTenant(ctx, fmt.Sprintf("%s%d", name, i))
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		after := s.WriterStats()
		if busy = after.Busy - before.Busy; busy <= 0 {
			t.Errorf("%s: 50 writes took %s of the writer's busy time: want some", name, busy)
		}
		return busy, after.CPU - before.CPU
	}
	if _, cpu := phase("default"); cpu != 0 {
		t.Errorf("by default: 50 writes counted %s of the writer's CPU: want none", cpu)
	}
	s.MeasureWriterCPU(true)
	busy, on := phase("on")
	if on <= 0 || on > busy+50*50*time.Microsecond {
		t.Errorf("turned on: 50 writes counted %s of the writer's CPU in %s busy: want some, no more than busy", on, busy)
	}
	s.MeasureWriterCPU(false)
	if _, off := phase("off"); off > on/10 {
		t.Errorf("turned off: 50 writes counted %s of the writer's CPU, against %s while on: want at most the last measured group's", off, on)
	}
}

// The writer counts the statements it runs: a write of one insert is its transaction's BEGIN,
// the insert and COMMIT, a write that reads a row adds its query, and a write that fails adds
// the ROLLBACK of its pass, and its run again (the write alone, in a savepoint).
func TestWriterCountsItsStatements(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	count := func(f func(*Tx) error) int64 {
		t.Helper()
		before := s.WriterStats().Statements
		_ = s.Write(ctx, f)
		return s.WriterStats().Statements - before
	}
	insert := func(name string) func(*Tx) error {
		return func(tx *Tx) error {
			_, err := tx.InsertTenant(ctx, name)
			return err
		}
	}
	if got := count(insert("a")); got != 3 {
		t.Errorf("a write of one insert ran %d statements: want 3 (BEGIN, INSERT, COMMIT)", got)
	}
	if got := count(func(tx *Tx) error {
		_, err := tx.InsertTenant(ctx, "b")
		if err != nil {
			return err
		}
		var n int
		return tx.queryRow(ctx, "SELECT count(*) FROM tenants").Scan(&n)
	}); got != 4 {
		t.Errorf("a write of one insert and one query ran %d statements: want 4", got)
	}
	if got := count(insert("a")); got <= 4 {
		t.Errorf("a write that failed (tenant a exists) ran %d statements: want more than 4 (its pass rolled back, then run again in a savepoint)", got)
	}
}

// The writer counts the pages its commits write to the WAL: a commit writes each page it
// changed once, however many rows it took; a write that reads only writes none.
func TestWriterCountsItsWALPages(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	pages := func(f func(*Tx) error) int64 {
		t.Helper()
		before := s.WriterStats().WALPages
		if err := s.Write(ctx, f); err != nil {
			t.Fatal(err)
		}
		return s.WriterStats().WALPages - before
	}
	tenants := func(names ...string) func(*Tx) error {
		return func(tx *Tx) error {
			for _, n := range names {
				if _, err := tx.InsertTenant(ctx, n); err != nil {
					return err
				}
			}
			return nil
		}
	}
	one := pages(tenants("a"))
	if one < 1 {
		t.Fatalf("a commit of one insert wrote %d WAL pages: want at least 1", one)
	}
	// Ten more rows of the same small table share its pages.
	if ten := pages(tenants("b", "c", "d", "e", "f", "g", "h", "i", "j", "k")); ten < 1 || ten > one {
		t.Errorf("a commit of ten inserts wrote %d WAL pages, one of one insert %d: want as many", ten, one)
	}
	if got := pages(func(tx *Tx) error {
		var n int
		return tx.queryRow(ctx, "SELECT count(*) FROM tenants").Scan(&n)
	}); got != 0 {
		t.Errorf("a write that only read wrote %d WAL pages: want 0", got)
	}
}

// While an execution trace runs, each of the writer's groups is a region of its own (what
// `bcd sim --trace` is read for): the trace names it once a group ran.
func TestWriterGroupsAreTraceRegions(t *testing.T) {
	if rtrace.IsEnabled() {
		t.Skip("a trace is already running (go test -trace)")
	}
	ctx := context.Background()
	s := openTempSQLite(t)
	var buf bytes.Buffer
	if err := rtrace.Start(&buf); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := s.Write(ctx, func(tx *Tx) error {
			_, err := tx.InsertTenant(ctx, fmt.Sprintf("t%d", i))
			return err
		}); err != nil {
			rtrace.Stop()
			t.Fatal(err)
		}
	}
	rtrace.Stop()
	if !bytes.Contains(buf.Bytes(), []byte(writerGroupRegion)) {
		t.Errorf("a trace of %d bytes over three writes does not name the region %q", buf.Len(), writerGroupRegion)
	}
}
