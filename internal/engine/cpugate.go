package engine

import (
	"context"
	"runtime"
	"sync/atomic"
)

// cpuGate admits a bounded number of goroutines at a time into the CPU-heavy work the engine
// does for agents beside the store's writer: signing a joining node's certificate, checking an
// attested result's signature, reading a claim's candidates. Every verb and report waits on the
// one writer; when a crowd of agents' goroutines runs such work at once, the Go scheduler
// preempts the writer after its time slice and it waits for a processor behind them (measured
// in bcd sim: the writer's time inside its groups was 1.34 times its CPU time, 1.30 with the
// gate). With at most GOMAXPROCS−1 of them running, one processor stays free for the writer.
//
// Nothing holding a slot waits on the writer (a slot is held only around the work itself), and
// the writer never takes a slot.
type cpuGate struct {
	slots    chan struct{}
	admitted atomic.Int64 // admissions so far (tests read it)
}

// newCPUGate admits n at a time; n < 1 is GOMAXPROCS−1, at least 1.
func newCPUGate(n int) *cpuGate {
	if n < 1 {
		n = max(1, runtime.GOMAXPROCS(0)-1)
	}
	return &cpuGate{slots: make(chan struct{}, n)}
}

// run runs f once a slot is free, or returns ctx's error without running it.
func (g *cpuGate) run(ctx context.Context, f func()) error {
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-g.slots }()
	g.admitted.Add(1)
	f()
	return nil
}

// CPUBound runs f through the gate the engine's own CPU-heavy agent work goes through, and
// returns ctx's error, not running f, if ctx ends first. It is for callers in this process whose
// CPU-heavy work competes with the engine's for its processors: bcd sim's simulated machines make
// their keys and sign their results with it (real machines do that on their own processors). f
// must not write to the store.
func (e *Engine) CPUBound(ctx context.Context, f func()) error { return e.cpu.run(ctx, f) }
