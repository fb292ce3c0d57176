// Package cache holds Bounded, the small concurrency-safe map the engine and the CA keep what
// they computed in (decoded step lists, batches seen running, verified certificates), and
// Verified, the signature checks that passed (the CA's, the image catalog's).
package cache

import "sync"

// Bounded is a map safe for concurrent use that holds at most Max entries: one added to a full
// map empties it first; with Max 0 or less it keeps nothing. Entries are never stale by
// construction of what callers keep (values derived from their keys alone, or facts that never
// change), so emptying only costs a recomputation. The zero value is unusable: make one with
// New.
type Bounded[K comparable, V any] struct {
	mu  sync.Mutex
	m   map[K]V
	max int
}

// New returns an empty Bounded holding at most max entries.
func New[K comparable, V any](max int) *Bounded[K, V] {
	return &Bounded[K, V]{m: map[K]V{}, max: max}
}

// Get returns the value kept for k.
func (b *Bounded[K, V]) Get(k K) (V, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.m[k]
	return v, ok
}

// Put keeps v for k, emptying the map first when it is full.
func (b *Bounded[K, V]) Put(k K, v V) {
	if b.max <= 0 {
		return // room for nothing: keep nothing
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.m[k]; !ok && len(b.m) >= b.max {
		b.m = map[K]V{}
	}
	b.m[k] = v
}

// Delete drops what is kept for k.
func (b *Bounded[K, V]) Delete(k K) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, k)
}

// Len is how many entries are kept.
func (b *Bounded[K, V]) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}
