package gateway

import (
	"testing"
	"time"
)

// nextPoll: a site agent's stream, a signal and a claim that found work keep the poll at its
// base; a node's stream whose poll found nothing doubles its wait, up to the idle bound.
func TestNextPoll(t *testing.T) {
	base, idle := 2*time.Second, 32*time.Second
	for _, node := range []bool{false, true} {
		for _, polled := range []bool{false, true} {
			for _, found := range []bool{false, true} {
				for _, every := range []time.Duration{base, 4 * time.Second, 16 * time.Second, 32 * time.Second} {
					got := nextPoll(every, base, idle, node, polled, found)
					want := base
					if node && polled && !found {
						want = min(2*every, idle)
					}
					if got != want {
						t.Errorf("node %v polled %v found %v after %s: %s, want %s", node, polled, found, every, got, want)
					}
				}
			}
		}
	}
	// An idle node's stream: 2, 4, 8, 16, 32, 32 s.
	every, seq := base, []time.Duration{}
	for range 6 {
		every = nextPoll(every, base, idle, true, true, false)
		seq = append(seq, every)
	}
	want := []time.Duration{4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, 32 * time.Second, 32 * time.Second}
	for i := range want {
		if seq[i] != want[i] {
			t.Fatalf("idle node's waits %v, want %v", seq, want)
		}
	}
	// A wait never falls under the base, whatever the bounds.
	if got := nextPoll(time.Millisecond, base, idle, true, true, false); got < base {
		t.Errorf("wait %s under the base %s", got, base)
	}
}
