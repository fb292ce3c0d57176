package site

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"bcd/internal/bmc"
)

// bmcLocks allows one call in flight per BMC (keyed by driver and address): commands wait for
// their turn, the power poller skips a BMC that is busy. Entries are dropped when unused.
type bmcLocks struct {
	mu    sync.Mutex
	slots map[string]*bmcSlot
}

type bmcSlot struct {
	ch   chan struct{} // one token: held while a call runs
	refs int
}

func newBMCLocks() *bmcLocks { return &bmcLocks{slots: map[string]*bmcSlot{}} }

func (l *bmcLocks) ref(key string) *bmcSlot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s, ok := l.slots[key]
	if !ok {
		s = &bmcSlot{ch: make(chan struct{}, 1)}
		l.slots[key] = s
	}
	s.refs++
	return s
}

func (l *bmcLocks) unref(key string, s *bmcSlot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.refs--
	if s.refs == 0 {
		delete(l.slots, key)
	}
}

// Lock waits for key's slot; the returned func releases it.
func (l *bmcLocks) Lock(ctx context.Context, key string) (func(), error) {
	s := l.ref(key)
	select {
	case s.ch <- struct{}{}:
		return l.releaser(key, s), nil
	case <-ctx.Done():
		l.unref(key, s)
		return nil, fmt.Errorf("waiting for BMC %s: %w", key, ctx.Err())
	}
}

// TryLock takes key's slot if it is free.
func (l *bmcLocks) TryLock(key string) (func(), bool) {
	s := l.ref(key)
	select {
	case s.ch <- struct{}{}:
		return l.releaser(key, s), true
	default:
		l.unref(key, s)
		return nil, false
	}
}

func (l *bmcLocks) releaser(key string, s *bmcSlot) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			<-s.ch
			l.unref(key, s)
		})
	}
}

// bmcKey names a BMC for the locks and the poller.
func bmcKey(driver, address string) string { return driver + "|" + address }

// shownBMCKey is a bmcKey as logs show it: its address redacted (bmc.ShownAddress).
func shownBMCKey(key string) string {
	driver, address, _ := strings.Cut(key, "|")
	return bmcKey(driver, bmc.ShownAddress(address))
}
