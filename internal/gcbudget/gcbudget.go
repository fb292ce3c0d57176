// Package gcbudget gives Go's collector a memory budget: a process whose heap is small next to
// the budget collects only when it reaches the budget, not at every doubling of its live heap
// (GOGC=100, Go's default), and one whose heap has outgrown the budget is collected exactly as
// Go would without it. A server that keeps a few tens of MiB live while it moves
// thousands of machines otherwise spends a tenth of its CPU collecting a heap that turns over
// every few hundred milliseconds (docs/benchmarks.md, session 44).
//
// It works through the runtime's two settings, chosen again after every collection (Settings):
// GOGC off (debug.SetGCPercent(-1)) and the budget as the memory limit (debug.SetMemoryLimit)
// while the heap is small, the process's own settings once it is not.
package gcbudget

import (
	"log/slog"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// Settings are the collector's settings for a process whose last collection left live bytes
// of live heap objects, with stacks bytes of goroutine stacks and other bytes of the runtime's
// other memory (metadata, buffers, the heap's spans' unused room), under a budget, where the
// process's own settings (Go's default, or its environment's) are gcPercent and limit: while
// what those let the process reach before they collect (the heap twice what was live, the
// stacks counted as GOGC counts them, and the rest beside it) fits in the budget, GOGC off and
// the budget as the memory limit; once it does not, the process's own settings, untouched. So
// the collector never runs more often than without a budget, and a heap that outgrows the
// budget is collected, scavenged and held exactly as Go would. Pure.
func Settings(budget int64, live, stacks, other uint64, gcPercent int, limit int64) (int, int64) {
	if gcPercent < 0 {
		return gcPercent, limit // (the process collects only at its own limit: nothing to pace)
	}
	heapGoal := float64(live) + (float64(live)+float64(stacks))*float64(gcPercent)/100
	if reach := heapGoal + float64(stacks) + float64(other); reach < float64(budget) {
		return -1, budget
	}
	return gcPercent, limit
}

// measure reads what Settings needs from the runtime: the live heap its last collection marked,
// the stacks, and the rest: what the runtime holds outside the heap (its metadata, buffers,
// system stacks) and the heap's spans' unused room. Free spans are left out: the heap's
// growth reuses them before it asks the system for more.
func measure() (live, stacks, other uint64) {
	names := [...]string{
		"/gc/heap/live:bytes",
		"/memory/classes/heap/stacks:bytes",
		"/memory/classes/total:bytes",
		"/memory/classes/heap/objects:bytes",
		"/memory/classes/heap/unused:bytes",
		"/memory/classes/heap/free:bytes",
		"/memory/classes/heap/released:bytes",
	}
	s := make([]metrics.Sample, len(names))
	for i, n := range names {
		s[i].Name = n
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	live, stacks = v(0), v(1)
	total, objects, unused, free, released := v(2), v(3), v(4), v(5), v(6)
	if heap := stacks + objects + unused + free + released; total > heap {
		other = total - heap
	}
	return live, stacks, other + unused
}

// Budget is a running budget (Start); Stop gives the collector back its settings from before.
type Budget struct {
	budget    int64
	oldGC     int
	oldLimit  int64
	collected atomic.Int64 // collections seen (each chose the settings again)
	// gc and limit are the settings made last (each change waits for a collection's marking
	// to end, when GOGC goes off: made only when they change).
	gc    int
	limit int64

	// mu orders a collection's new settings and Stop: settings made after Stop would outlive it.
	mu      sync.Mutex
	stopped bool
}

// running says a Budget holds the collector's settings. They are the process's, as the
// runtime's are (so this is the package's one variable, as store's page-cache switch is): a
// second Start while one runs would save the first's settings as the ones to give back, and
// leave them behind at its Stop.
var running atomic.Bool

// sentinel is garbage the collector finds at each collection: its cleanup chooses the settings
// again, then leaves a new one. (It holds a pointer, so the runtime gives it an allocation of
// its own.)
type sentinel struct{ _ *int }

// Start sets the collector to budget bytes (at least 1 MiB), as Settings says after each
// collection until Stop. fromEnv says the process's environment sets the collector itself
// (GOGC or GOMEMLIMIT): the operator's setting is then left as it is, and Start returns nil, as
// it does while another Budget runs.
func Start(budget int64, fromEnv bool, log *slog.Logger) *Budget {
	if fromEnv {
		log.Info("the collector is left as GOGC and GOMEMLIMIT set it; the memory budget is not applied")
		return nil
	}
	if !running.CompareAndSwap(false, true) {
		log.Info("a memory budget already runs in this process; this one is not applied")
		return nil
	}
	b := &Budget{budget: max(budget, 1<<20), gc: -1}
	b.oldGC = debug.SetGCPercent(-1)
	b.limit = b.budget
	b.oldLimit = debug.SetMemoryLimit(b.budget)
	b.apply()
	b.arm()
	log.Info("the collector's memory budget", "budget_mib", b.budget>>20)
	return b
}

// apply sets the collector as Settings says for what the last collection left.
func (b *Budget) apply() {
	live, stacks, other := measure()
	gc, limit := Settings(b.budget, live, stacks, other, b.oldGC, b.oldLimit)
	if gc != b.gc {
		debug.SetGCPercent(gc)
		b.gc = gc
	}
	if limit != b.limit {
		debug.SetMemoryLimit(limit)
		b.limit = limit
	}
}

// arm leaves a sentinel for the next collection.
func (b *Budget) arm() {
	s := &sentinel{}
	runtime.AddCleanup(s, func(b *Budget) { b.collected.Add(1); b.afterCollection() }, b)
}

func (b *Budget) afterCollection() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return
	}
	b.apply()
	b.arm()
}

// Collections is how many collections the budget has seen since Start.
func (b *Budget) Collections() int64 { return b.collected.Load() }

// Stop gives the collector back the settings it had before Start. A nil Budget (Start left the
// environment's settings) does nothing.
func (b *Budget) Stop() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return
	}
	b.stopped = true
	debug.SetGCPercent(b.oldGC)
	debug.SetMemoryLimit(b.oldLimit)
	running.Store(false)
}
