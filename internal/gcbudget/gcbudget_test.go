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

func TestLimit(t *testing.T) {
	for _, tc := range []struct {
		name                string
		budget              int64
		live, stacks, other uint64
		want                int64
	}{
		{"a small heap: the budget", 192 * mib, 20 * mib, 2 * mib, 10 * mib, 192 * mib},
		{"just under half the budget", 100 * mib, 40 * mib, 5 * mib, 9 * mib, 100 * mib},
		{"past half: GOGC=100's pace", 100 * mib, 45 * mib, 5 * mib, 10 * mib, 110 * mib},
		{"a large heap", 192 * mib, 600 * mib, 40 * mib, 60 * mib, 1340 * mib},
		{"nothing measured", 192 * mib, 0, 0, 0, 192 * mib},
		{"beyond int64", 1, math.MaxUint64 / 2, math.MaxUint64 / 2, 0, math.MaxInt64},
	} {
		if got := Limit(tc.budget, tc.live, tc.stacks, tc.other); got != tc.want {
			t.Errorf("%s: %d MiB, want %d MiB", tc.name, got/mib, tc.want/mib)
		}
	}
}

// collector reads the collector's settings without changing them.
func collector() (gcPercent int, limit int64) {
	gcPercent = debug.SetGCPercent(100)
	debug.SetGCPercent(gcPercent)
	return gcPercent, debug.SetMemoryLimit(-1)
}

// waitLimit collects until the limit satisfies ok, or fails the test after a deadline.
func waitLimit(t *testing.T, b *Budget, what string, ok func(int64) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		seen := b.Collections()
		runtime.GC()
		// The cleanup runs on its own goroutine after the collection: wait for it.
		for b.Collections() == seen && time.Now().Before(deadline) {
			runtime.Gosched()
		}
		t.Logf("%s: %d collections seen", what, b.Collections())
		if _, l := collector(); ok(l) {
			return
		}
		if time.Now().After(deadline) {
			_, l := collector()
			t.Fatalf("%s: limit %d MiB after %d collections", what, l/mib, b.Collections())
		}
	}
}

var keep [][]byte

// A running budget turns GOGC off and holds the limit at the budget while the live heap is
// small; past half of it the limit follows twice the live heap (GOGC=100's pace), and comes back
// when the heap does. Stop gives back the settings from before.
func TestBudgetFollowsTheLiveHeap(t *testing.T) {
	gc0, limit0 := collector()
	var logs bytes.Buffer
	b := Start(8*mib, false, slog.New(slog.NewTextHandler(&logs, nil)))
	if gc, l := collector(); gc != -1 || l < 8*mib {
		t.Fatalf("started: GOGC %d, limit %d MiB; want off and at least the budget", gc, l/mib)
	}
	if !strings.Contains(logs.String(), "budget_mib=8") {
		t.Errorf("logged %q", logs.String())
	}
	for range 64 {
		keep = append(keep, make([]byte, mib))
	}
	waitLimit(t, b, "64 MiB live", func(l int64) bool { return l >= 128*mib })
	keep = nil
	waitLimit(t, b, "the heap released", func(l int64) bool { return l < 64*mib })
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
