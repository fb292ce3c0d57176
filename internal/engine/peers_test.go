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

// TestSkewedServerJudgesNobodyDead: two servers on one PostgreSQL store, one whose clock is 45 s
// ahead, with a peer timeout of 1 s. Both keep the database's time (Heartbeat syncs the store's
// clock), so neither sees the other's heartbeats as old: the agent connected to the other
// server stays connected, and the skewed server's offset is recorded for doctor.
func TestSkewedServerJudgesNobodyDead(t *testing.T) {
	dsn := storetest.DSN(t, store.Postgres)
	ctx := context.Background()
	cfg := Config{PeerTimeout: time.Second, AgentGrace: 100 * time.Millisecond}
	open := func(skew time.Duration) (*Engine, *store.Store) {
		st, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		st.SetLocalClock(func() time.Time { return time.Now().Add(skew) })
		return New(st, nil, slog.New(slog.DiscardHandler), cfg), st
	}
	ahead, _ := open(45 * time.Second)
	b, st := open(0)
	x := Agent{ID: "agent-x", Kind: "site", SiteID: "s1", ConnID: "x1"}
	if err := b.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Connected(ctx, x, "t"); err != nil {
		t.Fatal(err)
	}
	// Both beat for longer than the peer timeout: the skewed one now judges its peers.
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
		for _, e := range []*Engine{ahead, b} {
			if err := e.Heartbeat(ctx); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, e := range []*Engine{ahead, b} {
		if err := e.reapAgents(ctx); err != nil {
			t.Fatal(err)
		}
	}
	agents, err := st.SiteAgents(ctx)
	if err != nil || len(agents) != 1 || !agents[0].Connected {
		t.Fatalf("agent connected to the other server: %+v (%v); want still connected", agents, err)
	}
	servers, err := st.Servers(ctx)
	if err != nil || len(servers) != 2 {
		t.Fatalf("servers: %+v (%v)", servers, err)
	}
	for _, sv := range servers {
		want := time.Duration(0)
		if sv.ID == ahead.ID() {
			want = -45 * time.Second
		}
		if (sv.ClockOffset - want).Abs() > time.Second {
			t.Errorf("server %s: clock offset %s, want about %s", sv.ID, sv.ClockOffset, want)
		}
	}
}
