package sim

import (
	"strings"
	"testing"
	"time"
)

func TestQuantileFromBuckets(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name   string
		within map[time.Duration]int64
		n      int64
		q      float64
		want   time.Duration
		ok     bool
	}{
		{"the first bucket begins at 0", map[time.Duration]int64{10 * ms: 10}, 10, 0.5, 5 * ms, true},
		{"placed linearly within its bucket", map[time.Duration]int64{time.Second: 50, 2 * time.Second: 100}, 100, 0.99, 1980 * ms, true},
		{"at a bucket's upper bound", map[time.Duration]int64{ms: 10, 2 * ms: 20, 4 * ms: 40}, 40, 0.5, 2 * ms, true},
		{"empty buckets passed over", map[time.Duration]int64{ms: 0, 2 * ms: 0, 4 * ms: 10}, 10, 0.5, 3 * ms, true},
		{"in the unbounded bucket: the largest bound", map[time.Duration]int64{ms: 5, 2 * ms: 5}, 10, 0.99, 2 * ms, true},
		{"all in the unbounded bucket", map[time.Duration]int64{ms: 0}, 3, 0.5, ms, true},
		{"no observations", map[time.Duration]int64{ms: 0}, 0, 0.5, 0, false},
		{"no buckets", nil, 10, 0.5, 0, false},
		{"a bucket above the count", map[time.Duration]int64{ms: 11}, 10, 0.5, 0, false},
		{"a bucket below the one before (a reading across a restart)", map[time.Duration]int64{ms: 6, 2 * ms: 4}, 10, 0.99, 0, false},
		{"q outside (0, 1)", map[time.Duration]int64{ms: 10}, 10, 1, 0, false},
	}
	for _, c := range cases {
		got, ok := quantile(c.within, c.n, c.q)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: quantile(%v, %d, %g) = %s, %v; want %s, %v", c.name, c.within, c.n, c.q, got, ok, c.want, c.ok)
		}
	}
}

// A server's histogram read twice: the phase's waits are what ended between the readings, its
// median and 99th percentile estimated from the buckets' growth; a target whose server gave
// no buckets keeps the mean alone.
func TestWaitsSinceEstimateFromTheServersBuckets(t *testing.T) {
	ms := time.Millisecond
	before := map[string]WaitTotal{
		"site":    {Commands: 100, Sum: 10 * time.Second, Within: map[time.Duration]int64{64 * ms: 40, 128 * ms: 90, 256 * ms: 100}},
		"ramdisk": {Commands: 4, Sum: time.Second},
	}
	after := map[string]WaitTotal{
		// 100 more: 10 within 64 ms, 40 within 64–128 ms, 49 within 128–256 ms, 1 above.
		"site":    {Commands: 200, Sum: 25 * time.Second, Within: map[time.Duration]int64{64 * ms: 50, 128 * ms: 140, 256 * ms: 199}},
		"ramdisk": {Commands: 8, Sum: 3 * time.Second},
	}
	got := waitsSince(before, after)
	site, ramdisk := got["site"], got["ramdisk"]
	// Rank 50 of 100: the 40th of the 40 in 64–128 ms, its upper bound. Rank 99: the 49th of
	// the 49 in 128–256 ms.
	if want := (Wait{Commands: 100, Mean: 150 * ms, P50: 128 * ms, P99: 256 * ms, Estimated: true}); site != want {
		t.Errorf("site waits %+v, want %+v", site, want)
	}
	if want := (Wait{Commands: 4, Mean: 500 * ms}); ramdisk != want {
		t.Errorf("ramdisk waits %+v, want %+v (the mean alone: no buckets)", ramdisk, want)
	}
	line := Phase{Name: "deploy → deployed", Nodes: 1, Waits: got}.String()
	if !strings.Contains(line, "waited for an agent: ramdisk mean 500ms, site p50 ~128ms p99 ~256ms") {
		t.Errorf("phase line %q: want the site's estimates marked as such and the ramdisk's mean", line)
	}
}
