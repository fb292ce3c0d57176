package engine

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestServersHearEachOthersWork: two engines on one PostgreSQL store, as two servers. Work one
// queues for an agent (a notice) wakes that agent's stream on the other at once; its own
// notices come back to it only through its local signal, once.
func TestServersHearEachOthersWork(t *testing.T) {
	dsn := storetest.DSN(t, store.Postgres)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func() *Engine {
		st, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		e := New(st, nil, slog.New(slog.DiscardHandler), Config{})
		done := make(chan error, 1)
		go func() { done <- e.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return e
	}
	a, b := open(), open()
	site := Agent{ID: "site-agent", Kind: "site", SiteID: "s1"}
	onB, endB := b.Subscribe(site)
	defer endB()
	onA, endA := a.Subscribe(site)
	defer endA()
	// The listener starts with Run: publish until b hears (what is published before it
	// listens is not kept), within a deadline.
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	heard := false
	for !heard {
		a.publish([]notice{"site:s1"})
		select {
		case <-onB:
			heard = true
		case <-tick.C:
		case <-deadline:
			t.Fatal("server B never heard of the work server A queued")
		}
	}
	// Another site's notice does not wake this site's stream (once those published before B
	// heard one have come in).
	time.Sleep(200 * time.Millisecond)
	for len(onB) > 0 {
		<-onB
	}
	a.publish([]notice{"site:s2"})
	select {
	case <-onB:
		t.Fatal("a notice for another site woke this one")
	case <-time.After(300 * time.Millisecond):
	}
	// A's own notices signal its stream locally, and are not heard back from the store.
	for len(onA) > 0 {
		<-onA
	}
	a.publish([]notice{"site:s1"})
	<-onA
	select {
	case <-onA:
		t.Fatal("server A heard its own notice back")
	case <-time.After(300 * time.Millisecond):
	}
}
