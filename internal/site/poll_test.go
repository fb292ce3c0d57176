package site

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"bcd/internal/bmc"
)

func TestPollDelay(t *testing.T) {
	const s = time.Second
	tests := []struct {
		fails  int
		jitter float64
		u      float64
		want   time.Duration
	}{
		{0, 0.2, 0.5, 60 * s},
		{0, 0.2, 0, 48 * s},
		{0, 0.2, 1, 72 * s},
		{1, 0.2, 0.5, 120 * s},
		{3, 0.2, 0.5, 480 * s},
		{4, 0.2, 0.5, 600 * s},   // ceiling
		{100, 0.2, 0.5, 600 * s}, // no overflow
		{100, 0.2, 1, 720 * s},
	}
	for _, tc := range tests {
		if got := pollDelay(60*s, 600*s, tc.fails, tc.jitter, tc.u); got != tc.want {
			t.Errorf("pollDelay(fails %d, u %.1f) = %s, want %s", tc.fails, tc.u, got, tc.want)
		}
	}
}

type reports struct {
	mu       sync.Mutex
	got      map[string][]bmc.PowerState // successful readings
	failures map[string][]int            // failed readings: the failure count each carried
	ch       chan struct{}
}

func (r *reports) ReportPower(_ context.Context, pr PowerReading) error {
	r.mu.Lock()
	if pr.Err != nil {
		r.failures[pr.NodeID] = append(r.failures[pr.NodeID], pr.Failures)
	} else {
		r.got[pr.NodeID] = append(r.got[pr.NodeID], pr.Power)
	}
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
	return nil
}

func (r *reports) of(node string) []bmc.PowerState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bmc.PowerState(nil), r.got[node]...)
}

func (r *reports) failuresOf(node string) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.failures[node]...)
}

// TestPoller: nodes behind one BMC are never read concurrently; a failing BMC is read less and
// less often; changes (and first readings) are reported once; every failure is reported with
// the BMC's consecutive failure count, and the first success after failures is reported (so the
// control plane can clear BMC_UNREACHABLE).
func TestPoller(t *testing.T) {
	defer goleak.VerifyNone(t)
	var mu sync.Mutex
	inFlight := map[string]int{}
	maxInFlight := map[string]int{}
	calls := map[string]int{}
	power := map[string]bmc.PowerState{"n1": bmc.PowerOff, "n2": bmc.PowerOn, "n3": bmc.PowerOn}
	healed := false // the failing BMC answers again
	probe := func(ctx context.Context, ref BMCRef, jwe string) (bmc.PowerState, error) {
		mu.Lock()
		inFlight[ref.Address]++
		maxInFlight[ref.Address] = max(maxInFlight[ref.Address], inFlight[ref.Address])
		calls[ref.Address]++
		p := power[jwe]
		mu.Unlock()
		select {
		case <-time.After(5 * time.Millisecond): // a BMC takes time to answer
		case <-ctx.Done():
		}
		mu.Lock()
		inFlight[ref.Address]--
		ok := healed
		mu.Unlock()
		if ref.Address == "bad" && !ok {
			return "", errors.New("timeout")
		}
		return p, nil
	}
	r := &reports{got: map[string][]bmc.PowerState{}, failures: map[string][]int{}, ch: make(chan struct{}, 1)}
	p := newPoller(PollConfig{Interval: 20 * time.Millisecond, MaxInterval: time.Second, RetryBusy: 2 * time.Millisecond},
		probe, newBMCLocks(), r, slog.New(slog.DiscardHandler), time.Now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	chassis := BMCRef{Driver: "ipmi", Address: "chassis"}
	p.Watch("n1", chassis, "n1") // the "JWE" names the node's power in this fake
	p.Watch("n2", chassis, "n2")
	p.Watch("n3", BMCRef{Driver: "ipmi", Address: "bad"}, "n3")

	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for !ok() {
			select {
			case <-r.ch:
			case <-time.After(20 * time.Millisecond):
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("first readings", func() bool { return len(r.of("n1")) == 1 && len(r.of("n2")) == 1 })
	mu.Lock()
	power["n1"] = bmc.PowerOn
	mu.Unlock()
	waitFor("the change of n1", func() bool { return len(r.of("n1")) == 2 })
	time.Sleep(400 * time.Millisecond) // let both BMCs be polled for a while
	mu.Lock()
	badCalls, chassisCalls := calls["bad"], calls["chassis"]
	healed = true
	mu.Unlock()
	waitFor("the failing BMC's recovery", func() bool { return len(r.of("n3")) == 1 })
	cancel()
	<-done

	if got := r.of("n1"); got[0] != bmc.PowerOff || got[1] != bmc.PowerOn || len(got) != 2 {
		t.Errorf("n1 reports %v, want [off on]", got)
	}
	if got := r.of("n2"); len(got) != 1 {
		t.Errorf("n2 reports %v, want one (no change)", got)
	}
	if got := r.of("n3"); len(got) != 1 || got[0] != bmc.PowerOn {
		t.Errorf("n3 (BMC failing, then answering) reports %v, want [on] once it answered", got)
	}
	if f := r.failuresOf("n3"); len(f) < 2 || f[0] != 1 || f[1] != 2 {
		t.Errorf("n3 failure reports carry counts %v, want 1, 2, …", f)
	}
	if f := r.failuresOf("n1"); len(f) != 0 {
		t.Errorf("n1 (healthy) reported failures %v", f)
	}
	mu.Lock()
	defer mu.Unlock()
	if maxInFlight["chassis"] != 1 {
		t.Errorf("%d reads in flight on one BMC, want 1", maxInFlight["chassis"])
	}
	// In ~0.5 s a healthy 20 ms interval gives each of two nodes ~20 reads; a failing BMC backs
	// off 20, 40, 80, 160, 320 ms: at most ~6 reads.
	if badCalls > 7 || chassisCalls < 2*badCalls {
		t.Errorf("reads: failing BMC %d, healthy chassis %d: no back-off", badCalls, chassisCalls)
	}
	t.Logf("reads in the window: healthy chassis (2 nodes) %d, failing BMC %d", chassisCalls, badCalls)
}

// TestPollerNeverStorms: a poll set of many nodes, each behind its own BMC, is read with at
// most Parallel reads in flight, the first reads spread over the interval (no burst when the
// set arrives), and a node dropped from the set is no longer read; paused, nothing is read.
func TestPollerNeverStorms(t *testing.T) {
	defer goleak.VerifyNone(t)
	const nodes, parallel = 300, 4
	var mu sync.Mutex
	inFlight, maxInFlight, reads := 0, 0, map[string]int{}
	probe := func(ctx context.Context, ref BMCRef, jwe string) (bmc.PowerState, error) {
		mu.Lock()
		inFlight++
		maxInFlight = max(maxInFlight, inFlight)
		reads[jwe]++
		mu.Unlock()
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
		return bmc.PowerOn, nil
	}
	r := &reports{got: map[string][]bmc.PowerState{}, failures: map[string][]int{}, ch: make(chan struct{}, 1)}
	interval := 300 * time.Millisecond
	p := newPoller(PollConfig{Interval: interval, Parallel: parallel, RetryBusy: time.Millisecond}, probe, newBMCLocks(), r, slog.New(slog.DiscardHandler), time.Now)
	set := make([]SetTarget, nodes)
	for i := range set {
		id := fmt.Sprintf("n%03d", i)
		set[i] = SetTarget{NodeID: id, Ref: BMCRef{Driver: "redfish", Address: "bmc-" + id}, JWE: id}
	}
	start := time.Now()
	p.SetTargets(set)
	// The first reads are spread over the interval: 10 slices of it, none with more than twice
	// its share.
	p.mu.Lock()
	buckets := make([]int, 10)
	for _, tg := range p.targets {
		buckets[min(int(tg.next.Sub(start)*10/interval), 9)]++
	}
	p.mu.Unlock()
	for i, n := range buckets {
		if n > 2*nodes/10 {
			t.Errorf("slice %d of the interval holds %d first reads of %d: a burst", i, n, nodes)
		}
	}
	p.SetActive(false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	time.Sleep(2 * interval) // paused: every first read is due by now, none may start
	mu.Lock()
	paused := len(reads)
	mu.Unlock()
	if paused != 0 {
		t.Errorf("%d nodes read while paused", paused)
	}
	p.SetActive(true)
	waitReads := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			done := ok()
			mu.Unlock()
			if done {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out: %s", what)
			}
			time.Sleep(5 * time.Millisecond) // poll with a deadline
		}
	}
	waitReads("every node read", func() bool { return len(reads) == nodes })
	p.SetTargets(set[:1])
	mu.Lock()
	after := reads["n299"]
	mu.Unlock()
	waitReads("n000 read twice more", func() bool { return reads["n000"] >= 3 })
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if maxInFlight > parallel {
		t.Errorf("%d reads in flight, bound %d", maxInFlight, parallel)
	}
	if reads["n299"] > after+1 { // one read may have been in flight when it was dropped
		t.Errorf("a node dropped from the poll set was read %d more times", reads["n299"]-after)
	}
	t.Logf("%d nodes: at most %d reads in flight (bound %d)", nodes, maxInFlight, parallel)
}

// BenchmarkPollerDispatch measures a dispatch with nothing due (what every completed read costs
// the poller: it pokes the loop), by poll-set size. Before the due queue it was a pass over every
// node: 2.4 ms at 10,000 nodes, 100 ms at 100,000.
func BenchmarkPollerDispatch(b *testing.B) {
	for _, n := range []int{1000, 10000, 100000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			p := newPoller(PollConfig{Interval: time.Hour}, nil, newBMCLocks(), nil, slog.New(slog.DiscardHandler), time.Now)
			set := make([]SetTarget, n)
			for i := range set {
				id := fmt.Sprintf("n%06d", i)
				set[i] = SetTarget{NodeID: id, Ref: BMCRef{Driver: "ipmi", Address: id}, JWE: id}
			}
			p.SetTargets(set)
			p.mu.Lock()
			for _, t := range p.targets {
				p.scheduleLocked(t, time.Now().Add(time.Hour)) // nothing due
			}
			p.mu.Unlock()
			sem := make(chan struct{}, 16)
			var wg sync.WaitGroup
			ctx := context.Background()
			b.ResetTimer()
			for b.Loop() {
				p.dispatch(ctx, sem, &wg)
			}
		})
	}
}
