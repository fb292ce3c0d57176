// Package cache holds Bounded, the small concurrency-safe map (bounded, in two generations) the
// engine and the CA keep what they computed in (decoded step lists, batches seen running,
// verified certificates), and Verified, the signature checks that passed (the CA's, the image
// catalog's).
package cache

import "sync"

// Bounded is a map safe for concurrent use that holds at most Max entries, in two generations
// of up to half of Max each: an entry is added to the newer; when the newer is full it becomes
// the older and the older is dropped, and an entry found in the older moves to the newer. So
// what was added or used last is kept (at least half of Max entries) where a map emptied when
// full would lose everything at once: an entry put a moment before the emptying, for a caller
// about to look for it, would be missed. With Max 0 or less it keeps nothing. Entries are never
// stale by construction of what callers keep (values derived from their keys alone, or facts
// that never change), so dropping one only costs a recomputation. The zero value is unusable:
// make one with New.
type Bounded[K comparable, V any] struct {
	mu       sync.Mutex
	cur, old map[K]V
	// gen is the most entries one generation holds (half of Max, at least 1; 0 keeps nothing),
	// and limit is Max.
	gen, limit int
}

// New returns an empty Bounded holding at most limit entries.
func New[K comparable, V any](limit int) *Bounded[K, V] {
	gen := 0
	if limit > 0 {
		gen = max(1, limit/2)
	}
	return &Bounded[K, V]{cur: map[K]V{}, old: map[K]V{}, gen: gen, limit: limit}
}

// Get returns the value kept for k (an entry of the older generation moves to the newer).
func (b *Bounded[K, V]) Get(k K) (V, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if v, ok := b.cur[k]; ok {
		return v, true
	}
	v, ok := b.old[k]
	if ok {
		delete(b.old, k)
		b.add(k, v)
	}
	return v, ok
}

// Put keeps v for k.
func (b *Bounded[K, V]) Put(k K, v V) {
	if b.gen <= 0 {
		return // room for nothing: keep nothing
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.cur[k]; ok {
		b.cur[k] = v
		return
	}
	delete(b.old, k)
	b.add(k, v)
}

// add puts k, absent from both generations, in the newer, which becomes the older first when
// it is full (with Max 1 there is room for no older one). b.mu is held.
func (b *Bounded[K, V]) add(k K, v V) {
	if len(b.cur) >= b.gen {
		b.old, b.cur = b.cur, make(map[K]V, b.gen)
		if 2*b.gen > b.limit {
			clear(b.old)
		}
	}
	b.cur[k] = v
}

// Delete drops what is kept for k.
func (b *Bounded[K, V]) Delete(k K) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.cur, k)
	delete(b.old, k)
}

// Len is how many entries are kept.
func (b *Bounded[K, V]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.cur) + len(b.old)
}
