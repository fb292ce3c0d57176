package gcbudget

import (
	"bytes"
	"log/slog"
	"math"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

const mib = 1 << 20

func TestSettings(t *testing.T) {
	const noLimit = math.MaxInt64
	for _, tc := range []struct {
		name                string
		budget              int64
		live, stacks, other uint64
		gcPercent           int
		limit               int64
		wantGC              int
		wantLimit           int64
	}{
		{"a small heap: the budget", 192 * mib, 20 * mib, 2 * mib, 10 * mib, 100, noLimit, -1, 192 * mib},
		{"GOGC=100 reaches just under the budget", 100 * mib, 40 * mib, 5 * mib, 9 * mib, 100, noLimit, -1, 100 * mib},
		{"GOGC=100 reaches the budget: Go's own", 100 * mib, 40 * mib, 5 * mib, 10 * mib, 100, noLimit, 100, noLimit},
		{"a large heap: Go's own", 192 * mib, 600 * mib, 40 * mib, 60 * mib, 100, noLimit, 100, noLimit},
		{"a large heap under GOGC=50 and a limit", 192 * mib, 600 * mib, 40 * mib, 60 * mib, 50, 4096 * mib, 50, 4096 * mib},
		{"GOGC=400 reaches the budget sooner", 192 * mib, 40 * mib, 2 * mib, 10 * mib, 400, noLimit, 400, noLimit},
		{"nothing measured yet", 192 * mib, 0, 0, 0, 100, noLimit, -1, 192 * mib},
		{"the process's own GOGC off: left", 192 * mib, 1 * mib, 0, 0, -1, 512 * mib, -1, 512 * mib},
	} {
		gc, limit := Settings(tc.budget, tc.live, tc.stacks, tc.other, tc.gcPercent, tc.limit)
		if gc != tc.wantGC || limit != tc.wantLimit {
			t.Errorf("%s: GOGC %d, limit %d MiB; want %d, %d MiB", tc.name, gc, limit/mib, tc.wantGC, tc.wantLimit/mib)
		}
	}
}

// collector reads the collector's settings without changing them.
func collector() (gcPercent int, limit int64) {
	gcPercent = debug.SetGCPercent(100)
	debug.SetGCPercent(gcPercent)
	return gcPercent, debug.SetMemoryLimit(-1)
}

// waitSettings collects until the collector's settings satisfy ok, or fails the test after a
// deadline.
func waitSettings(t *testing.T, b *Budget, what string, ok func(gc int, limit int64) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		seen := b.Collections()
		runtime.GC()
		// The cleanup runs on its own goroutine after the collection: wait for it a moment (a
		// sentinel left while this collection marked lives until the next one, collected above).
		for wait := time.Now().Add(100 * time.Millisecond); b.Collections() == seen && time.Now().Before(wait); {
			runtime.Gosched()
		}
		if gc, l := collector(); ok(gc, l) {
			return
		}
		if time.Now().After(deadline) {
			gc, l := collector()
			t.Fatalf("%s: GOGC %d, limit %d MiB after %d collections", what, gc, l/mib, b.Collections())
		}
	}
}

var keep [][]byte

// A running budget turns GOGC off with the budget as the limit while the heap is small; once
// GOGC=100 would let it pass the budget, the process's own settings come back, and the budget
// when the heap shrinks again. Stop gives back the settings from before.
func TestBudgetFollowsTheLiveHeap(t *testing.T) {
	gc0, limit0 := collector()
	var logs bytes.Buffer
	b := Start(32*mib, false, slog.New(slog.NewTextHandler(&logs, nil)))
	waitSettings(t, b, "a small heap", func(gc int, l int64) bool { return gc == -1 && l == 32*mib })
	if !strings.Contains(logs.String(), "budget_mib=32") {
		t.Errorf("logged %q", logs.String())
	}
	for range 64 {
		keep = append(keep, make([]byte, mib))
	}
	waitSettings(t, b, "64 MiB live", func(gc int, l int64) bool { return gc == gc0 && l == limit0 })
	keep = nil
	waitSettings(t, b, "the heap released", func(gc int, l int64) bool { return gc == -1 && l == 32*mib })
	b.Stop()
	b.Stop() // (twice is once)
	if gc, l := collector(); gc != gc0 || l != limit0 {
		t.Errorf("stopped: GOGC %d, limit %d; want %d and %d as before", gc, l, gc0, limit0)
	}
	// A collection after Stop changes nothing.
	runtime.GC()
	if gc, l := collector(); gc != gc0 || l != limit0 {
		t.Errorf("after a collection: GOGC %d, limit %d; want %d and %d", gc, l, gc0, limit0)
	}
}

// An operator's GOGC or GOMEMLIMIT wins: Start changes nothing and says so.
func TestEnvironmentWins(t *testing.T) {
	gc0, limit0 := collector()
	var logs bytes.Buffer
	b := Start(8*mib, true, slog.New(slog.NewTextHandler(&logs, nil)))
	if b != nil {
		t.Fatal("a budget from an environment that sets the collector")
	}
	b.Stop() // (a nil budget's Stop does nothing)
	if gc, l := collector(); gc != gc0 || l != limit0 {
		t.Errorf("GOGC %d, limit %d; want %d and %d as the environment left them", gc, l, gc0, limit0)
	}
	if !strings.Contains(logs.String(), "GOGC and GOMEMLIMIT") {
		t.Errorf("logged %q", logs.String())
	}
}

// One budget at a time: the collector's settings are the process's. A second Start while one
// runs changes nothing and says so; once the first stops, a budget can start again.
func TestOneBudgetAtATime(t *testing.T) {
	gc0, limit0 := collector()
	quiet := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	first := Start(32*mib, false, quiet)
	gc1, limit1 := collector()
	var logs bytes.Buffer
	if second := Start(8*mib, false, slog.New(slog.NewTextHandler(&logs, nil))); second != nil {
		second.Stop()
		t.Fatal("a second budget started while one runs")
	}
	if gc, l := collector(); gc != gc1 || l != limit1 || !strings.Contains(logs.String(), "already runs") {
		t.Errorf("the second Start changed GOGC %d → %d, limit %d → %d; logged %q", gc1, gc, limit1, l, logs.String())
	}
	first.Stop()
	if gc, l := collector(); gc != gc0 || l != limit0 {
		t.Errorf("after the first's Stop: GOGC %d, limit %d; want %d and %d", gc, l, gc0, limit0)
	}
	again := Start(8*mib, false, quiet)
	if again == nil {
		t.Fatal("no budget after the first stopped")
	}
	again.Stop()
}
