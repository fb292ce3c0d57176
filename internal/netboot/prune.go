package netboot

import (
	"cmp"
	"slices"
	"time"
)

// HeldArtifact is one verified artifact of the cache as pruning sees it.
type HeldArtifact struct {
	SHA256  string
	Bytes   int64
	LastUse time.Time // last fetch, serve, or prune that found it referenced
}

// PrunePolicy is what the cache keeps.
type PrunePolicy struct {
	// Bound is the most bytes of verified artifacts kept; 0 or less: no bound.
	Bound int64
	// Retain: an unreferenced artifact unused for this long is removed even under the bound;
	// 0 or less: kept until the bound needs its room.
	Retain time.Duration
}

// EvictReason says why an artifact was evicted.
type EvictReason string

// Eviction reasons.
const (
	// EvictUnused: no reference and no use for the retention period.
	EvictUnused EvictReason = "unused"
	// EvictOverBound: no reference, the least recently used, and the cache exceeded its bound.
	EvictOverBound EvictReason = "over-bound"
)

// Eviction is one artifact PlanPrune removes, and why.
type Eviction struct {
	HeldArtifact
	Reason EvictReason
}

// PrunePlan is what PlanPrune decided.
type PrunePlan struct {
	Evict     []Eviction // in the order to remove them
	KeptBytes int64      // bytes held once they are removed
	// PinnedBytes are the bytes of the artifacts in use (never evicted). KeptBytes above the
	// bound means the artifacts in use alone exceed it.
	PinnedBytes int64
}

// OverBound reports whether what the plan keeps still exceeds the bound (the artifacts in use
// alone do).
func (p PrunePlan) OverBound(pol PrunePolicy) bool {
	return pol.Bound > 0 && p.KeptBytes > pol.Bound
}

// PlanPrune decides which artifacts to remove from held. An artifact inUse is never removed.
// Of the others, those unused for p.Retain go first (reason EvictUnused); then, while the bytes
// held exceed p.Bound, the least recently used (reason EvictOverBound; ties by digest, for a
// stable order). A last use after now (a clock stepped back) counts as now. Pure.
func PlanPrune(held []HeldArtifact, inUse map[string]bool, p PrunePolicy, now time.Time) PrunePlan {
	var plan PrunePlan
	var candidates []HeldArtifact
	for _, h := range held {
		plan.KeptBytes += h.Bytes
		if inUse[h.SHA256] {
			plan.PinnedBytes += h.Bytes
			continue
		}
		if h.LastUse.After(now) {
			h.LastUse = now
		}
		candidates = append(candidates, h)
	}
	slices.SortFunc(candidates, func(a, b HeldArtifact) int {
		if c := a.LastUse.Compare(b.LastUse); c != 0 {
			return c
		}
		return cmp.Compare(a.SHA256, b.SHA256)
	})
	rest := candidates[:0:0]
	for _, h := range candidates {
		if p.Retain > 0 && !now.Before(h.LastUse.Add(p.Retain)) {
			plan.Evict = append(plan.Evict, Eviction{HeldArtifact: h, Reason: EvictUnused})
			plan.KeptBytes -= h.Bytes
			continue
		}
		rest = append(rest, h)
	}
	for _, h := range rest {
		if p.Bound <= 0 || plan.KeptBytes <= p.Bound {
			break
		}
		plan.Evict = append(plan.Evict, Eviction{HeldArtifact: h, Reason: EvictOverBound})
		plan.KeptBytes -= h.Bytes
	}
	return plan
}
