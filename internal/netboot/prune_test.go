package netboot

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestPlanPrune(t *testing.T) {
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	const day = 24 * time.Hour
	// art is an artifact named by one letter (its digest is the letter repeated), of n bytes,
	// last used ago before now.
	art := func(name string, n int64, ago time.Duration) HeldArtifact {
		return HeldArtifact{SHA256: strings.Repeat(name, 64), Bytes: n, LastUse: now.Add(-ago)}
	}
	type ev struct {
		name   string
		reason EvictReason
	}
	tests := []struct {
		name      string
		held      []HeldArtifact
		inUse     []string
		policy    PrunePolicy
		want      []ev
		kept      int64
		pinned    int64
		overBound bool
	}{
		{name: "empty cache", policy: PrunePolicy{Bound: 1, Retain: time.Second}},
		{name: "no bound, no retention: everything kept however old",
			held: []HeldArtifact{art("a", 1<<40, 1000*day), art("b", 1, 0)}, kept: 1<<40 + 1},
		{name: "negative bound and retention mean none",
			held:   []HeldArtifact{art("a", 100, 1000*day)},
			policy: PrunePolicy{Bound: -1, Retain: -time.Hour}, kept: 100},
		{name: "under the bound, all recent",
			held:   []HeldArtifact{art("a", 100, time.Hour), art("b", 100, 2*time.Hour)},
			policy: PrunePolicy{Bound: 1000, Retain: 7 * day}, kept: 200},
		{name: "exactly at the bound: kept",
			held:   []HeldArtifact{art("a", 100, 3*time.Hour), art("b", 100, 2*time.Hour), art("c", 100, time.Hour)},
			policy: PrunePolicy{Bound: 300}, kept: 300},
		{name: "one byte over: the least recently used goes, and only it",
			held:   []HeldArtifact{art("b", 100, 2*time.Hour), art("a", 100, 3*time.Hour), art("c", 100, time.Hour)},
			policy: PrunePolicy{Bound: 299},
			want:   []ev{{"a", EvictOverBound}}, kept: 200},
		{name: "far over: oldest first until within",
			held:   []HeldArtifact{art("a", 100, 3*time.Hour), art("b", 100, 2*time.Hour), art("c", 100, time.Hour), art("d", 100, 0)},
			policy: PrunePolicy{Bound: 150},
			want:   []ev{{"a", EvictOverBound}, {"b", EvictOverBound}, {"c", EvictOverBound}}, kept: 100},
		{name: "strict LRU: a small old one goes before a big recent one, even if it frees too little",
			held:   []HeldArtifact{art("a", 1, 3*time.Hour), art("b", 500, time.Hour)},
			policy: PrunePolicy{Bound: 100},
			want:   []ev{{"a", EvictOverBound}, {"b", EvictOverBound}}, kept: 0},
		{name: "an artifact in use is skipped, the next oldest goes",
			held:   []HeldArtifact{art("a", 100, 3*time.Hour), art("b", 100, 2*time.Hour), art("c", 100, time.Hour)},
			inUse:  []string{"a"},
			policy: PrunePolicy{Bound: 250},
			want:   []ev{{"b", EvictOverBound}}, kept: 200, pinned: 100},
		{name: "all in use and over the bound: nothing goes, over bound",
			held:   []HeldArtifact{art("a", 100, 3*time.Hour), art("b", 100, 2*time.Hour)},
			inUse:  []string{"a", "b"},
			policy: PrunePolicy{Bound: 50, Retain: time.Hour},
			kept:   200, pinned: 200, overBound: true},
		{name: "in use alone exceeds the bound: every other artifact goes",
			held:   []HeldArtifact{art("a", 300, 3*time.Hour), art("b", 10, 2*time.Hour), art("c", 10, 0)},
			inUse:  []string{"a"},
			policy: PrunePolicy{Bound: 200},
			want:   []ev{{"b", EvictOverBound}, {"c", EvictOverBound}}, kept: 300, pinned: 300, overBound: true},
		{name: "one artifact larger than the bound, unused: it goes",
			held:   []HeldArtifact{art("a", 1000, 0)},
			policy: PrunePolicy{Bound: 999},
			want:   []ev{{"a", EvictOverBound}}},
		{name: "one artifact larger than the bound, in use: kept, over bound",
			held: []HeldArtifact{art("a", 1000, 0)}, inUse: []string{"a"},
			policy: PrunePolicy{Bound: 999}, kept: 1000, pinned: 1000, overBound: true},
		{name: "retention: unused for the period goes even under the bound; in use never",
			held:   []HeldArtifact{art("a", 100, 8*day), art("b", 100, 30*day), art("c", 100, 6*day)},
			inUse:  []string{"b"},
			policy: PrunePolicy{Bound: 1 << 30, Retain: 7 * day},
			want:   []ev{{"a", EvictUnused}}, kept: 200, pinned: 100},
		{name: "retention with no bound",
			held:   []HeldArtifact{art("a", 100, 8*day), art("b", 100, day)},
			policy: PrunePolicy{Retain: 7 * day},
			want:   []ev{{"a", EvictUnused}}, kept: 100},
		{name: "retention boundary: exactly the period goes, a nanosecond less stays",
			held:   []HeldArtifact{art("a", 1, 7*day), art("b", 1, 7*day-time.Nanosecond)},
			policy: PrunePolicy{Retain: 7 * day},
			want:   []ev{{"a", EvictUnused}}, kept: 1},
		{name: "retention first, then the bound for what is still over",
			held:   []HeldArtifact{art("a", 100, 10*day), art("b", 100, 2*day), art("c", 100, day), art("d", 100, 0)},
			policy: PrunePolicy{Bound: 150, Retain: 7 * day},
			want:   []ev{{"a", EvictUnused}, {"b", EvictOverBound}, {"c", EvictOverBound}}, kept: 100},
		{name: "retention alone brings it within the bound",
			held:   []HeldArtifact{art("a", 100, 10*day), art("b", 100, 9*day), art("c", 100, 0)},
			policy: PrunePolicy{Bound: 150, Retain: 7 * day},
			want:   []ev{{"a", EvictUnused}, {"b", EvictUnused}}, kept: 100},
		{name: "ties in last use: by digest",
			held:   []HeldArtifact{art("c", 100, time.Hour), art("a", 100, time.Hour), art("b", 100, time.Hour)},
			policy: PrunePolicy{Bound: 100},
			want:   []ev{{"a", EvictOverBound}, {"b", EvictOverBound}}, kept: 100},
		{name: "a last use in the future counts as now: not expired, most recent",
			held:   []HeldArtifact{art("a", 100, -100*day), art("b", 100, time.Minute)},
			policy: PrunePolicy{Bound: 100, Retain: time.Hour},
			want:   []ev{{"b", EvictOverBound}}, kept: 100},
		{name: "zero-byte artifacts count in the order, free nothing",
			held:   []HeldArtifact{art("a", 0, 3*time.Hour), art("b", 100, 2*time.Hour), art("c", 100, time.Hour)},
			policy: PrunePolicy{Bound: 100},
			want:   []ev{{"a", EvictOverBound}, {"b", EvictOverBound}}, kept: 100},
		{name: "references to digests not held change nothing",
			held:   []HeldArtifact{art("a", 100, 2*time.Hour), art("b", 100, time.Hour)},
			inUse:  []string{"z"},
			policy: PrunePolicy{Bound: 100},
			want:   []ev{{"a", EvictOverBound}}, kept: 100},
		{name: "zero retention with a bound: only the bound evicts",
			held:   []HeldArtifact{art("a", 100, 1000*day)},
			policy: PrunePolicy{Bound: 100}, kept: 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var inUse map[string]bool
			if tt.inUse != nil {
				inUse = map[string]bool{}
				for _, n := range tt.inUse {
					inUse[strings.Repeat(n, 64)] = true
				}
			}
			in := slices.Clone(tt.held)
			plan := PlanPrune(in, inUse, tt.policy, now)
			if !slices.Equal(in, tt.held) {
				t.Error("PlanPrune changed its input")
			}
			var got []ev
			for _, e := range plan.Evict {
				got = append(got, ev{e.SHA256[:1], e.Reason})
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("evicted %v, want %v", got, tt.want)
			}
			if plan.KeptBytes != tt.kept || plan.PinnedBytes != tt.pinned {
				t.Errorf("kept %d, pinned %d bytes; want %d, %d", plan.KeptBytes, plan.PinnedBytes, tt.kept, tt.pinned)
			}
			if plan.OverBound(tt.policy) != tt.overBound {
				t.Errorf("over bound %t, want %t", plan.OverBound(tt.policy), tt.overBound)
			}
		})
	}
}

// TestPlanPruneInvariants checks, on many random caches, what every plan must hold: nothing in
// use goes; exactly the unused artifacts past retention go for it; bound evictions are the
// least recently used of the rest, no more than needed, and leave the cache within its bound
// unless what is in use alone exceeds it.
func TestPlanPruneInvariants(t *testing.T) {
	now := time.Date(2030, 6, 1, 12, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(1, 2))
	const hex = "0123456789abcdef"
	for i := range 20000 {
		n := rng.IntN(8)
		held := make([]HeldArtifact, n)
		inUse := map[string]bool{}
		var total int64
		for j := range held {
			b := make([]byte, 64)
			for k := range b {
				b[k] = hex[rng.IntN(16)]
			}
			held[j] = HeldArtifact{SHA256: string(b), Bytes: rng.Int64N(1000), LastUse: now.Add(-time.Duration(rng.IntN(20)-2) * time.Hour)}
			total += held[j].Bytes
			if rng.IntN(3) == 0 {
				inUse[held[j].SHA256] = true
			}
		}
		p := PrunePolicy{Bound: rng.Int64N(4000) - 500, Retain: time.Duration(rng.IntN(24)-4) * time.Hour}
		plan := PlanPrune(held, inUse, p, now)

		gone := map[string]Eviction{}
		var freed int64
		for _, e := range plan.Evict {
			if _, dup := gone[e.SHA256]; dup {
				t.Fatalf("case %d: %s evicted twice", i, e.SHA256)
			}
			gone[e.SHA256] = e
			freed += e.Bytes
		}
		if plan.KeptBytes != total-freed {
			t.Fatalf("case %d: kept %d, want %d", i, plan.KeptBytes, total-freed)
		}
		last := func(h HeldArtifact) time.Time {
			if h.LastUse.After(now) {
				return now
			}
			return h.LastUse
		}
		var oldestKept *HeldArtifact // the least recently used artifact not in use and kept
		var newestBound *Eviction    // the most recently used artifact evicted for the bound
		for j, h := range held {
			e, evicted := gone[h.SHA256]
			expired := p.Retain > 0 && !now.Before(last(h).Add(p.Retain))
			switch {
			case inUse[h.SHA256] && evicted:
				t.Fatalf("case %d: %s is in use and was evicted", i, h.SHA256)
			case inUse[h.SHA256]:
			case expired != (evicted && e.Reason == EvictUnused):
				t.Fatalf("case %d: %s expired %t, evicted %v", i, h.SHA256, expired, e)
			case !evicted:
				if oldestKept == nil || last(h).Before(last(*oldestKept)) {
					oldestKept = &held[j]
				}
			case e.Reason == EvictOverBound:
				if newestBound == nil || last(h).After(newestBound.LastUse) {
					newestBound = &e
				}
			}
		}
		if newestBound != nil {
			if p.Bound <= 0 {
				t.Fatalf("case %d: bound evictions without a bound", i)
			}
			if oldestKept != nil && last(*oldestKept).Before(newestBound.LastUse) {
				t.Fatalf("case %d: kept %s, used before the evicted %s", i, oldestKept.SHA256, newestBound.SHA256)
			}
			// The last bound eviction was needed.
			if plan.KeptBytes+plan.Evict[len(plan.Evict)-1].Bytes <= p.Bound {
				t.Fatalf("case %d: one eviction too many (kept %d, bound %d)", i, plan.KeptBytes, p.Bound)
			}
		}
		if p.Bound > 0 && plan.KeptBytes > p.Bound && oldestKept != nil {
			t.Fatalf("case %d: over the bound (%d > %d) with %s still evictable", i, plan.KeptBytes, p.Bound, oldestKept.SHA256)
		}
	}
}
