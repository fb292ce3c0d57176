package engine

import (
	"context"
	"runtime"
	"slices"
	"sync"
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
//
// Waiters are admitted in the order they came, except that a site agent's claim goes before
// every node's work (runFirst): one claim hands out the next command of up to hundreds of
// machines, while a certificate or a result check moves one, so behind a queue of them (tens of
// milliseconds at 10 000 nodes) every site command waited that long again.
type cpuGate struct {
	slots    int
	mu       sync.Mutex
	free     int                // slots not held
	lanes    [2][]chan struct{} // waiters: first, then the rest; each closed when admitted
	admitted atomic.Int64       // admissions so far (tests read it)
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
	return &cpuGate{slots: n, free: n}
}

// The gate's lanes: runFirst's waiters are admitted before run's.
const (
	laneFirst = iota
	laneRest
)

// run runs f once a slot is free and every waiter before it was admitted, or returns ctx's
// error without running it.
func (g *cpuGate) run(ctx context.Context, f func()) error { return g.runIn(ctx, laneRest, f) }

// runFirst is run for a site agent's claim: it is admitted before every waiter of run.
func (g *cpuGate) runFirst(ctx context.Context, f func()) error { return g.runIn(ctx, laneFirst, f) }

func (g *cpuGate) runIn(ctx context.Context, lane int, f func()) error {
	asked := time.Now()
	if err := g.acquire(ctx, lane); err != nil {
		return err
	}
	admitted := time.Now()
	defer func() {
		g.busy.Add(int64(time.Since(admitted)))
		g.release()
	}()
	g.admitted.Add(1)
	g.waited.Add(int64(admitted.Sub(asked)))
	f()
	return nil
}

func (g *cpuGate) acquire(ctx context.Context, lane int) error {
	g.mu.Lock()
	if g.free > 0 {
		g.free-- // a slot is free only while nobody waits (release hands it on)
		g.mu.Unlock()
		return nil
	}
	admit := make(chan struct{})
	g.lanes[lane] = append(g.lanes[lane], admit)
	g.mu.Unlock()
	select {
	case <-admit:
		return nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	if i := slices.Index(g.lanes[lane], admit); i >= 0 {
		g.lanes[lane] = slices.Delete(g.lanes[lane], i, i+1)
		g.mu.Unlock()
		return ctx.Err()
	}
	g.mu.Unlock()
	g.release() // admitted as the context ended: the slot goes to the next
	return ctx.Err()
}

// release hands the slot to the first waiter of the first lane that has one, else frees it.
func (g *cpuGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for l := range g.lanes {
		if q := g.lanes[l]; len(q) > 0 {
			close(q[0])
			q[0] = nil
			g.lanes[l] = q[1:]
			return
		}
	}
	g.free++
}

func (g *cpuGate) stats() GateStats {
	return GateStats{Slots: g.slots, Admitted: g.admitted.Load(), Waited: time.Duration(g.waited.Load()), Busy: time.Duration(g.busy.Load())}
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
