package site

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestNextHeldUntil(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prev := t0.Add(2 * time.Second)
	tests := []struct {
		name string
		o    leaseOutcome
		want time.Time
	}{
		{"renewed: start + ttl", leaseHeld, t0.Add(5 * time.Second)},
		{"another holds it: stop now", leaseLost, time.Time{}},
		{"store unreachable: keep the previous deadline", leaseFailed, prev},
	}
	for _, tc := range tests {
		if got := nextHeldUntil(prev, t0, 5*time.Second, tc.o); !got.Equal(tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestMemoryLease(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	l := NewMemoryLease(clock)
	ctx := context.Background()
	steps := []struct {
		advance time.Duration
		agent   string
		want    bool
		holder  string
	}{
		{0, "a", true, "a"},
		{time.Second, "b", false, "a"},     // a's lease runs
		{time.Second, "a", true, "a"},      // renewal
		{4 * time.Second, "b", false, "a"}, // 4 s after the renewal: still a's
		{2 * time.Second, "b", true, "b"},  // expired: b takes it
		{0, "a", false, "b"},
	}
	for i, s := range steps {
		advance(s.advance)
		got, err := l.Acquire(ctx, "s", s.agent, 5*time.Second)
		if err != nil || got != s.want || l.Holder("s") != s.holder {
			t.Fatalf("step %d: %s acquire = %t, %v; holder %q; want %t, %q", i, s.agent, got, err, l.Holder("s"), s.want, s.holder)
		}
	}
	if err := l.Release(ctx, "s", "a"); err != nil || l.Holder("s") != "b" {
		t.Fatalf("release by a non-holder changed the holder to %q", l.Holder("s"))
	}
	if err := l.Release(ctx, "s", "b"); err != nil || l.Holder("s") != "" {
		t.Fatalf("release by the holder left %q", l.Holder("s"))
	}
	if ok, _ := l.Acquire(ctx, "other", "a", time.Second); !ok {
		t.Fatal("sites are independent")
	}
}

// scriptedLease answers Acquire from a function of the call number.
type scriptedLease struct {
	calls  atomic.Int32
	answer func(n int) (bool, error)
}

func (s *scriptedLease) Acquire(context.Context, string, string, time.Duration) (bool, error) {
	return s.answer(int(s.calls.Add(1)))
}

// TestLeaseLoopStopsWithinTTL: a holder that can no longer reach the lease store keeps serving
// until its last renewal's TTL runs out, never longer; one that is refused stops at once.
func TestLeaseLoopStopsWithinTTL(t *testing.T) {
	defer goleak.VerifyNone(t)
	const ttl = 600 * time.Millisecond
	tests := []struct {
		name   string
		answer func(n int) (bool, error)
		max    time.Duration // from the last successful renewal to not holding
	}{
		{"store unreachable", func(n int) (bool, error) {
			if n <= 2 {
				return true, nil
			}
			return false, errors.New("store down")
		}, ttl + 50*time.Millisecond},
		{"taken by another", func(n int) (bool, error) { return n <= 2, nil }, ttl/3 + 100*time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := &scriptedLease{answer: tc.answer}
			st := newHoldState(time.Now)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); leaseLoop(ctx, l, "s", "a", ttl, st, slog.New(slog.DiscardHandler)) }()
			defer func() { cancel(); <-done }()

			// Wait for the second (last successful) renewal, then for the end of the hold.
			var renewed time.Time
			deadline := time.After(5 * time.Second)
			for {
				ch := st.changed()
				if l.calls.Load() >= 2 && st.Held() && renewed.IsZero() {
					renewed = time.Now()
				}
				if !renewed.IsZero() && !st.Held() {
					break
				}
				timer := time.NewTimer(10 * time.Millisecond) // Held() turns false by the clock, not by a signal
				select {
				case <-ch:
				case <-timer.C:
				case <-deadline:
					t.Fatal("the hold never ended")
				}
				timer.Stop()
			}
			if took := time.Since(renewed); took > tc.max {
				t.Errorf("stopped serving %s after the last renewal, want ≤ %s", took, tc.max)
			}
		})
	}
}

// TestWhileHeld starts the service on acquisition, stops it (waiting for it) on loss, and
// restarts it after a failure while still held.
func TestWhileHeld(t *testing.T) {
	defer goleak.VerifyNone(t)
	st := newHoldState(time.Now)
	var running atomic.Int32
	starts := make(chan int, 10)
	var n atomic.Int32
	run := func(ctx context.Context) error {
		k := int(n.Add(1))
		running.Add(1)
		defer running.Add(-1)
		starts <- k
		if k == 2 {
			return errors.New("bind failed") // fails once: restarted after the delay
		}
		<-ctx.Done()
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		whileHeld(ctx, st, run, 50*time.Millisecond, slog.New(slog.DiscardHandler))
	}()
	wait := func(want int) {
		t.Helper()
		select {
		case k := <-starts:
			if k != want {
				t.Fatalf("start %d, want %d", k, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("start %d did not happen", want)
		}
	}
	select {
	case <-starts:
		t.Fatal("started without the lease")
	case <-time.After(100 * time.Millisecond):
	}
	st.set(time.Now().Add(time.Hour))
	wait(1)
	st.set(time.Time{}) // lost
	deadline := time.Now().Add(5 * time.Second)
	for running.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("service still running after the lease was lost")
		}
		time.Sleep(5 * time.Millisecond)
	}
	st.set(time.Now().Add(time.Hour))
	wait(2) // fails
	wait(3) // restarted
	cancel()
	<-done
	if running.Load() != 0 {
		t.Fatal("service still running after ctx ended")
	}
}
