package ipmi

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/lab/vbmc/ipmibmc"
)

// TestPacerLimitsConcurrentSessions runs many goroutines against one address and records the
// highest number inside the critical section at once.
func TestPacerLimitsConcurrentSessions(t *testing.T) {
	for _, limit := range []int{1, 3} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			p := NewPacer(PacerConfig{MaxSessions: limit, MinInterval: -1})
			var inside, peak atomic.Int32
			var wg sync.WaitGroup
			for range 64 {
				wg.Go(func() {
					release, err := p.Acquire(t.Context(), "10.0.0.1:623")
					if err != nil {
						t.Error(err)
						return
					}
					n := inside.Add(1)
					for {
						old := peak.Load()
						if n <= old || peak.CompareAndSwap(old, n) {
							break
						}
					}
					for range 100 { // hold the slot across scheduling points
						runtime.Gosched()
					}
					inside.Add(-1)
					release()
					release() // idempotent
				})
			}
			wg.Wait()
			if got := peak.Load(); got > int32(limit) || got < 1 {
				t.Fatalf("peak concurrency %d, limit %d", got, limit)
			}
			if limit > 1 && peak.Load() < 2 {
				t.Logf("peak %d below limit %d (scheduler did not overlap)", peak.Load(), limit)
			}
			p.mu.Lock()
			n := len(p.hosts)
			p.mu.Unlock()
			if n != 0 {
				t.Errorf("%d pacer entries left after every release", n)
			}
		})
	}
}

func TestPacerAddressesAreIndependent(t *testing.T) {
	p := NewPacer(PacerConfig{MaxSessions: 1, MinInterval: -1})
	r1, err := p.Acquire(t.Context(), "a:623")
	if err != nil {
		t.Fatal(err)
	}
	defer r1()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	r2, err := p.Acquire(ctx, "b:623")
	if err != nil {
		t.Fatalf("second address blocked by the first: %v", err)
	}
	r2()
}

func TestPacerAcquireHonoursCancellation(t *testing.T) {
	p := NewPacer(PacerConfig{MaxSessions: 1})
	release, err := p.Acquire(t.Context(), "a:623")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := p.Acquire(ctx, "a:623")
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	release()
	r, err := p.Acquire(t.Context(), "a:623")
	if err != nil {
		t.Fatalf("slot not freed: %v", err)
	}
	r()
}

func TestPacerSpacesCommands(t *testing.T) {
	const interval = 15 * time.Millisecond
	const n = 8
	p := NewPacer(PacerConfig{MinInterval: interval})
	var mu sync.Mutex
	var times []time.Time
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if err := p.Wait(t.Context(), "a:623"); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			times = append(times, time.Now())
			mu.Unlock()
		})
	}
	wg.Wait()
	first, last := times[0], times[0]
	for _, tm := range times {
		if tm.Before(first) {
			first = tm
		}
		if tm.After(last) {
			last = tm
		}
	}
	if span, min := last.Sub(first), time.Duration(n-1)*interval; span < min-time.Millisecond {
		t.Fatalf("%d commands spread over %s, want at least %s", n, span, min)
	}
}

func TestPacerWaitHonoursCancellation(t *testing.T) {
	p := NewPacer(PacerConfig{MinInterval: time.Hour})
	if err := p.Wait(t.Context(), "a:623"); err != nil { // first one goes at once
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	start := time.Now()
	if err := p.Wait(ctx, "a:623"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if time.Since(start) > time.Second {
		t.Fatal("Wait ignored cancellation")
	}
}

// TestPacerAgainstVirtualBMC drives one BMC from many goroutines through one shared pacer and
// samples the BMC's open sessions from inside each session.
func TestPacerAgainstVirtualBMC(t *testing.T) {
	for _, limit := range []int{1, 2} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			m := &fakeMachine{on: true}
			var peak atomic.Int32
			var bp atomic.Pointer[ipmibmc.BMC] // set after start; read from the BMC's goroutines
			m.onPoll = func() {
				n := int32(bp.Load().ActiveSessions())
				for {
					old := peak.Load()
					if n <= old || peak.CompareAndSwap(old, n) {
						return
					}
				}
			}
			b := startBMC(t, ipmibmc.Config{}, m)
			bp.Store(b)
			opts := quickOptions()
			opts.Pacer = NewPacer(PacerConfig{MaxSessions: limit, MinInterval: time.Millisecond})
			var wg sync.WaitGroup
			for range 12 {
				wg.Go(func() {
					d, err := New(bmc.Endpoint{Address: b.Addr().String(), Username: testUser, Password: testPassword}, opts)
					if err != nil {
						t.Error(err)
						return
					}
					if st, err := d.GetPower(t.Context()); err != nil || st != bmc.PowerOn {
						t.Errorf("GetPower = %s, %v", st, err)
					}
				})
			}
			wg.Wait()
			if got := peak.Load(); got < 1 || got > int32(limit) {
				t.Fatalf("BMC saw %d sessions at once, limit %d", got, limit)
			}
			t.Logf("limit %d: peak %d sessions at once", limit, peak.Load())
		})
	}
}
