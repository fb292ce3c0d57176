package sim

import (
	"cmp"
	"context"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// countingControl is a Control whose node counts and writer's work are scripts: the first call
// answers before (writerBefore), every later one after (writerAfter); the phase's nodes are in
// states.
type countingControl struct {
	mu                        sync.Mutex
	calls, writerCalls        int
	before, after             map[string]int
	writerBefore, writerAfter store.WriterStats
	states                    map[string]string
	faults                    map[string]string // the fault codes of failed nodes
	// counting: the counts after the mark that still answer before; updated: every node's
	// update time (zero: the time NodeTimes is called).
	counting int
	updated  time.Time
	// server: a server elsewhere whose work is serverBefore at the first reading and
	// serverAfter at every later one.
	server                    bool
	serverCalls               int
	serverBefore, serverAfter ServerWork
	// gate: the CPU gate's counts at the first reading and at every later one (none when
	// gateBefore has no slots); waits: the commands' waits for an agent.
	gateCalls             int
	gateBefore, gateAfter engine.GateStats
	waits                 map[string][]time.Duration
}

func (c *countingControl) CPUGate(context.Context) (engine.GateStats, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gateBefore.Slots == 0 {
		return engine.GateStats{}, false
	}
	c.gateCalls++
	if c.gateCalls == 1 {
		return c.gateBefore, true
	}
	return c.gateAfter, true
}

func (c *countingControl) CommandWaits(context.Context, time.Time) (map[string][]time.Duration, bool, error) {
	return c.waits, c.waits != nil, nil
}

func (c *countingControl) Engine() string { return "fake" }
func (c *countingControl) Enroll(context.Context, metal.EnrollInput) (string, error) {
	return "", nil
}
func (c *countingControl) Apply(context.Context, provision.Verb, metal.VerbInput) error { return nil }
func (c *countingControl) CountByState(context.Context) (map[string]int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.calls <= 1+c.counting {
		return c.before, nil
	}
	return c.after, nil
}

// NodeTimes lists every node it knows, as the API does (every node of the run).
func (c *countingControl) NodeTimes(context.Context, []string) ([]NodeTime, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []NodeTime
	for id, st := range c.states {
		out = append(out, NodeTime{ID: id, State: st, FaultCode: c.faults[id], UpdatedAt: cmp.Or(c.updated, time.Now())})
	}
	slices.SortFunc(out, func(a, b NodeTime) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}
func (c *countingControl) Nudge() {}
func (c *countingControl) Writer(context.Context) store.WriterStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writerCalls++
	if c.writerCalls == 1 {
		return c.writerBefore
	}
	return c.writerAfter
}
func (c *countingControl) WriteRoundTrips() int64 { return 0 }
func (c *countingControl) ServerRSSMiB(context.Context) (float64, bool) {
	return 0, false
}
func (c *countingControl) CommandsLost(context.Context) (int, bool) { return 0, false }
func (c *countingControl) ServerWork(context.Context) (ServerWork, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.server {
		return ServerWork{}, false
	}
	c.serverCalls++
	if c.serverCalls == 1 {
		return c.serverBefore, true
	}
	return c.serverAfter, true
}

// A phase counts the nodes that reached its state or failed since its mark, taken before its
// verbs: nodes that failed in an earlier phase neither end it early nor count among its
// failures, and one of its own that failed before the first count does not keep it waiting.
func TestMeasureCountsWhatChangedSinceTheMark(t *testing.T) {
	ctl := &countingControl{
		before: map[string]int{"failed": 5, "deployed": 7},
		after:  map[string]int{"failed": 6, "deployed": 9},
		states: map[string]string{"a": "deployed", "b": "failed", "c": "deployed", "z": "failed"}, // z: failed in an earlier phase
		faults: map[string]string{"b": "STEP_FAILED", "z": "POWER_FAILED"},
		// The writer's work before the phase, and after it: the phase's is the difference.
		writerBefore: store.WriterStats{Busy: time.Second, CPU: 800 * time.Millisecond, Groups: 10, Writes: 100, Statements: 1000, WALPages: 5000},
		writerAfter:  store.WriterStats{Busy: 3 * time.Second, CPU: 2300 * time.Millisecond, Groups: 14, Writes: 130, Statements: 1390, WALPages: 5600},
		// The gate's work before and after: 40 admissions that waited 200 ms in all.
		gateBefore: engine.GateStats{Slots: 1, Admitted: 60, Waited: time.Second, Busy: time.Second},
		gateAfter:  engine.GateStats{Slots: 1, Admitted: 100, Waited: 1200 * time.Millisecond, Busy: 1300 * time.Millisecond},
		waits: map[string][]time.Duration{
			"site":    {300 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond},
			"ramdisk": {5 * time.Millisecond},
			"os":      {},
		},
	}
	h := &Harness{ctl: ctl, Sim: New(Config{}, nil)}
	ctx := context.Background()
	m, err := h.mark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, reached, err := h.measure(ctx, "deploy → deployed", []string{"a", "b", "c"}, m, "deployed", 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Nodes != 3 || p.Failed != 1 || !slices.Equal(reached, []string{"a", "c"}) {
		t.Errorf("phase of %d nodes, %d failed, reached %v: want 3, 1 failed, a and c reached", p.Nodes, p.Failed, reached)
	}
	if !maps.Equal(p.Faults, map[string]int{"STEP_FAILED": 1}) {
		t.Errorf("faults %v: want the phase's failed node's code alone, STEP_FAILED 1", p.Faults)
	}
	if p.WriterBusy != 2*time.Second || p.WriterCPU != 1500*time.Millisecond || p.WriterCommits != 4 || p.WriterWrites != 30 || p.WriterStatements != 390 || p.WriterWALPages != 600 {
		t.Errorf("writer busy %s (cpu %s), %d commits, %d writes, %d statements, %d WAL pages in the phase: want 2s (1.5s), 4, 30, 390, 600",
			p.WriterBusy, p.WriterCPU, p.WriterCommits, p.WriterWrites, p.WriterStatements, p.WriterWALPages)
	}
	if p.GateSlots != 1 || p.GateAdmitted != 40 || p.GateWaited != 200*time.Millisecond || p.GateBusy != 300*time.Millisecond {
		t.Errorf("cpu gate in the phase: %d slots, %d admitted, waited %s, busy %s: want 1, 40, 200ms, 300ms", p.GateSlots, p.GateAdmitted, p.GateWaited, p.GateBusy)
	}
	wantWaits := map[string]Wait{"site": {Commands: 3, Mean: 200 * time.Millisecond, P50: 200 * time.Millisecond, P99: 300 * time.Millisecond},
		"ramdisk": {Commands: 1, Mean: 5 * time.Millisecond, P50: 5 * time.Millisecond, P99: 5 * time.Millisecond}}
	if !maps.Equal(p.Waits, wantWaits) {
		t.Errorf("waits for an agent %v: want %v (none for a target without commands)", p.Waits, wantWaits)
	}
	// (The heap's allocations, read as the collector's times are, are the runtime's counts.)
	p.AllocBytes = 3 * 40 << 10
	s := p.String()
	for _, want := range []string{"failed 1 (STEP_FAILED 1)", "7.5 writes/commit", "(cpu 500.00 ms/node)", "130 statements/node", "alloc 40 KiB/node",
		"waited for an agent: ramdisk p50 5ms p99 5ms, site p50 200ms p99 300ms", "cpu gate 5.0 ms wait/task"} {
		if !strings.Contains(s, want) {
			t.Errorf("phase line %q: want %q in it", s, want)
		}
	}
	if p.ServerCPU != 0 || p.ServerAllocBytes != 0 || strings.Contains(s, "server") {
		t.Errorf("in process: server cpu %s, %d bytes, line %q: want none", p.ServerCPU, p.ServerAllocBytes, s)
	}
}

// A phase ends when its last node rested, not when the count that saw it was made: its total
// and throughput are the last node's update time since the mark; a node updated after that
// count leaves the count's time.
func TestMeasureEndsAtTheLastNodesRest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		restedIn  time.Duration // after the mark; 0: as NodeTimes is called
		wantTotal time.Duration // 0: the count's time, at least its 200 ms poll
	}{
		{"rested before the count saw it", 50 * time.Millisecond, 50 * time.Millisecond},
		{"updated after the count", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctl := &countingControl{
				before:   map[string]int{"deployed": 0},
				after:    map[string]int{"deployed": 2},
				states:   map[string]string{"a": "deployed", "b": "deployed"},
				counting: 1, // the first count after the mark finds them busy: the next is 200 ms later
			}
			h := &Harness{ctl: ctl, Sim: New(Config{}, nil)}
			ctx := context.Background()
			m, err := h.mark(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if tc.restedIn > 0 {
				ctl.mu.Lock()
				ctl.updated = m.at.Add(tc.restedIn)
				ctl.mu.Unlock()
			}
			p, _, err := h.measure(ctx, "deploy → deployed", []string{"a", "b"}, m, "deployed", 5*time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantTotal > 0 {
				if p.Total != tc.wantTotal || p.NodesPerSec != 2/tc.wantTotal.Seconds() || p.P99 != tc.wantTotal {
					t.Errorf("total %s, %.1f nodes/s, p99 %s: want %s, %.1f, %s", p.Total, p.NodesPerSec, p.P99, tc.wantTotal, 2/tc.wantTotal.Seconds(), tc.wantTotal)
				}
				return
			}
			if p.Total < 200*time.Millisecond || p.NodesPerSec != 2/p.Total.Seconds() {
				t.Errorf("total %s, %.1f nodes/s: want the second count's time (200 ms or more) and 2 nodes over it", p.Total, p.NodesPerSec)
			}
		})
	}
}

// With a server elsewhere, a phase has the server's CPU and allocations from its mark to its
// end, and its line gives them per node.
func TestMeasureTakesAServersWorkSinceTheMark(t *testing.T) {
	ctl := &countingControl{
		before: map[string]int{"ready": 1},
		after:  map[string]int{"ready": 3},
		states: map[string]string{"a": "ready", "b": "ready"},
		server: true,
		// The server's work before the phase, and after it.
		serverBefore: ServerWork{CPU: 40 * time.Second, AllocBytes: 1 << 30, Connections: 100,
			Waits: map[string]WaitTotal{"site": {Commands: 10, Sum: time.Second}, "ramdisk": {Commands: 3, Sum: time.Second}}},
		serverAfter: ServerWork{CPU: 40*time.Second + 25*time.Millisecond, AllocBytes: 1<<30 + 2*300<<10, Connections: 109,
			Waits: map[string]WaitTotal{"site": {Commands: 14, Sum: 1200 * time.Millisecond}, "ramdisk": {Commands: 3, Sum: time.Second}}},
	}
	h := &Harness{ctl: ctl, Sim: New(Config{}, nil)}
	ctx := context.Background()
	m, err := h.mark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, _, err := h.measure(ctx, "undeploy → ready", []string{"a", "b"}, m, "ready", 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.ServerCPU != 25*time.Millisecond || p.ServerAllocBytes != 2*300<<10 || p.ServerConnections != 9 {
		t.Errorf("server cpu %s, %d bytes allocated, %d connections in the phase: want 25ms, %d, 9", p.ServerCPU, p.ServerAllocBytes, p.ServerConnections, 2*300<<10)
	}
	if s := p.String(); !strings.Contains(s, "server cpu 12.5 ms/node, alloc 300 KiB/node, 4.5 connections/node") ||
		!strings.Contains(s, "waited for an agent: site mean 50ms") || strings.Contains(s, "ramdisk") {
		t.Errorf("phase line %q: want the server's cpu and allocations per node in it, and its site commands' mean wait", s)
	}
	// The phase's waits are the server's count and sum since the mark: four site commands that
	// waited 200 ms in all; no ramdisk command ended.
	if want := map[string]Wait{"site": {Commands: 4, Mean: 50 * time.Millisecond}}; !maps.Equal(p.Waits, want) {
		t.Errorf("waits %v, want %v", p.Waits, want)
	}
}

func TestSettled(t *testing.T) {
	for _, tc := range []struct {
		name    string
		node    store.Node
		failed  int
		settled bool
	}{
		{"ready", store.Node{State: "ready"}, 0, true},
		{"ready in maintenance", store.Node{State: "ready", Maintenance: true}, 0, false},
		{"ready with a verb pending", store.Node{State: "ready", TargetState: "deployed"}, 0, false},
		{"failed with its fault", store.Node{State: "failed", Maintenance: true, FaultCode: "STEP_FAILED", FaultMsg: "disk.wipe lost"}, 1, true},
		{"failed without maintenance", store.Node{State: "failed", FaultCode: "STEP_FAILED", FaultMsg: "x"}, 0, false},
		{"failed without a message", store.Node{State: "failed", Maintenance: true, FaultCode: "STEP_FAILED"}, 0, false},
		{"still deploying", store.Node{State: "deploying"}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failed, unsettled := Settled([]store.Node{tc.node})
			if failed != tc.failed || (len(unsettled) == 0) != tc.settled {
				t.Errorf("failed %d, unsettled %q; want %d failed, settled %v", failed, unsettled, tc.failed, tc.settled)
			}
		})
	}
}

// The runtime's totals come from its metrics by their names: a collection that marks a live
// heap adds to the collector's CPU, assists never exceed it, and the heap's allocations count
// what was allocated (at least the bytes and objects this test made); none goes back.
func TestReadRuntimeTotals(t *testing.T) {
	before := readRuntimeTotals()
	const objects, size = 1 << 12, 1 << 10
	live := make([][]byte, 0, objects)
	for i := 0; i < cap(live); i++ {
		live = append(live, make([]byte, size))
	}
	runtime.GC()
	runtime.KeepAlive(live)
	after := readRuntimeTotals()
	if after.gc <= before.gc {
		t.Errorf("the collector's CPU went from %s to %s over a collection", before.gc, after.gc)
	}
	if after.assist < before.assist || after.assist > after.gc {
		t.Errorf("mark assists %s then %s, of %s in all", before.assist, after.assist, after.gc)
	}
	if got := after.allocBytes - before.allocBytes; got < objects*size {
		t.Errorf("the heap's allocations grew by %d bytes while the test allocated %d", got, objects*size)
	}
	if got := after.allocObjects - before.allocObjects; got < objects {
		t.Errorf("the heap's allocations grew by %d objects while the test allocated %d", got, objects)
	}
}
