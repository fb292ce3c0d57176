package store

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// The writer's CPU time is its own thread's, taken while it runs groups: some for groups that
// did work, never more than the time it was busy (a reading on another thread, or the process's
// CPU, would exceed it with the other goroutines' work).
func TestWriterCPUIsItsThreads(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the writer's thread CPU time is read on Linux")
	}
	ctx := context.Background()
	s := openTempSQLite(t)
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
