package engine

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"
)

// cpuGate admits a bounded number of goroutines at a time into the CPU-heavy work the engine
// does for agents beside the store's writer: signing a joining node's certificate, checking an
// attested result's signature, reading a claim's candidates on SQLite (on PostgreSQL that read
// is a round trip, made outside the gate). Every verb and report waits on the one writer;
// when a crowd of agents' goroutines runs such work at once, the Go scheduler preempts the
// writer after its time slice and it waits for a processor behind them (measured in bcd sim:
// the writer's time inside its groups was 1.34 times its CPU time, 1.30 with the gate). With
// at most GOMAXPROCS−1 of them running, one processor stays free for the writer.
//
// Nothing holding a slot waits on the writer, or on the network (a slot is held only around
// the work itself), and the writer never takes a slot.
type cpuGate struct {
	slots    chan struct{}
	admitted atomic.Int64 // admissions so far (tests read it)
	// waited and busy sum, in nanoseconds, the time admitted work waited for a slot and the
	// time it held one (GateStats).
	waited, busy atomic.Int64
}

// GateStats is what the CPU gate admitted so far: how many pieces of work, the time they
// waited for a slot in all, and the time they held one. Waited over Admitted is the mean wait
// (the processors are short when it grows); Busy over the elapsed time and Slots, how full the
// gate was.
type GateStats struct {
	Slots        int
	Admitted     int64
	Waited, Busy time.Duration
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
	asked := time.Now()
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	admitted := time.Now()
	defer func() {
		g.busy.Add(int64(time.Since(admitted)))
		<-g.slots
	}()
	g.admitted.Add(1)
	g.waited.Add(int64(admitted.Sub(asked)))
	f()
	return nil
}

func (g *cpuGate) stats() GateStats {
	return GateStats{Slots: cap(g.slots), Admitted: g.admitted.Load(), Waited: time.Duration(g.waited.Load()), Busy: time.Duration(g.busy.Load())}
}

// CPUGate is what the gate of the CPU-heavy work done for agents (cpuGate) admitted since the
// engine started.
func (e *Engine) CPUGate() GateStats { return e.cpu.stats() }

// CPUBound runs f through the gate the engine's own CPU-heavy agent work goes through, and
// returns ctx's error, not running f, if ctx ends first. It is for callers in this process whose
// CPU-heavy work competes with the engine's for its processors: bcd sim's simulated machines make
// their keys and sign their results with it (real machines do that on their own processors). f
// must not write to the store.
func (e *Engine) CPUBound(ctx context.Context, f func()) error { return e.cpu.run(ctx, f) }
