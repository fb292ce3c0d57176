package engine

import (
	"context"
	"database/sql"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

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
	hear := func(why string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			a.publish([]notice{"site:s1"})
			select {
			case <-onB:
				return
			case <-tick.C:
			case <-deadline:
				t.Fatalf("server B never heard of the work server A queued (%s)", why)
			}
		}
	}
	hear("listening from the start")
	// The listening connections die (a PostgreSQL restart, a proxy's idle cut): each server
	// listens again.
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var killed int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = $1`,
		"LISTEN "+pgx.Identifier{b.st.ChannelName(agentsChannel)}.Sanitize()).Scan(&killed); err != nil || killed != 2 {
		t.Fatalf("terminated %d listening connections (%v), want both servers'", killed, err)
	}
	hear("listening again after the connection died")
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
