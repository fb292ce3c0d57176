package engine

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"bcd/internal/console"
	"bcd/internal/gateway"
	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A site agent's console stream attaches only to a bmc.console command assigned to it, not
// ended, whose session this server holds.
func TestAttachConsole(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := storetest.Open(t, store.SQLite)
	e := New(st, nil, slog.New(slog.DiscardHandler), Config{RelayConsoles: true})
	hub, g := e.Consoles(), e.Gateway()
	ids := map[string]string{}
	for _, c := range []struct{ name, kind, state, agent string }{
		{"ok", "bmc.console", "running", "a1"},
		{"power", "bmc.power", "running", "a1"},
		{"ended", "bmc.console", "succeeded", "a1"},
		{"other agent's", "bmc.console", "delivered", "a2"},
		{"no session", "bmc.console", "running", "a1"},
	} {
		cmd := store.Command{Kind: c.kind, State: c.state, TargetAgent: c.agent, RunsOn: "site"}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.InsertCommand(ctx, &cmd) }); err != nil {
			t.Fatal(err)
		}
		ids[c.name] = cmd.ID
		if c.name != "no session" {
			if _, err := hub.Open(console.Info{ID: cmd.ID, NodeID: "n1"}); err != nil {
				t.Fatal(err)
			}
		}
	}
	a1 := gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: "s1", AgentID: "a1"}
	for name, want := range map[string]error{"power": gateway.ErrNoConsole, "ended": gateway.ErrNoConsole, "other agent's": gateway.ErrNotYourConsole, "no session": gateway.ErrNoConsole} {
		actx, stop := context.WithTimeout(ctx, 100*time.Millisecond)
		if _, err := g.AttachConsole(actx, a1, ids[name]); !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
		stop()
	}
	if _, err := g.AttachConsole(ctx, a1, "unknown-id"); !errors.Is(err, gateway.ErrNoConsole) {
		t.Errorf("unknown command: %v", err)
	}
	node := gateway.AgentRef{Kind: pki.KindNode, NodeID: "n1", AgentID: "a1"}
	if _, err := g.AttachConsole(ctx, node, ids["ok"]); !errors.Is(err, gateway.ErrNotYourConsole) {
		t.Errorf("a node's agent: %v", err)
	}
	end, err := g.AttachConsole(ctx, a1, ids["ok"])
	if err != nil || end == nil {
		t.Fatalf("the agent's own console: %v", err)
	}
}

// A console command is taken only by an agent connected to the server that holds its session
// (its console stream must reach that server's hub); other commands by any.
func TestConsoleClaimedThroughItsServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := storetest.Open(t, store.SQLite)
	e := New(st, nil, slog.New(slog.DiscardHandler), Config{RelayConsoles: true})
	ids := map[string]string{}
	for _, c := range []struct{ name, kind, args string }{
		{"ours", "bmc.console", `{"server":"` + e.ID() + `"}`},
		{"another server's", "bmc.console", `{"server":"elsewhere-1"}`},
		{"any server's", "bmc.console", `{}`},
		{"power", "bmc.power", `{"action":"on"}`},
	} {
		cmd := store.Command{Kind: c.kind, Args: c.args, SiteID: "s1", RunsOn: "site", Reroutable: true}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.InsertCommand(ctx, &cmd) }); err != nil {
			t.Fatal(err)
		}
		ids[cmd.ID] = c.name
	}
	got, err := e.Claim(ctx, Agent{ID: "a1", Kind: "site", SiteID: "s1", ConnID: "c1"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	taken := map[string]bool{}
	for _, c := range got {
		taken[ids[c.ID]] = true
	}
	for _, name := range []string{"ours", "any server's", "power"} {
		if !taken[name] {
			t.Errorf("%s not taken (took %v)", name, taken)
		}
	}
	if taken["another server's"] {
		t.Error("a console of another server's session taken")
	}
}

// The sweep withdraws the console commands no agent took whose server is gone, and only those.
func TestOrphanConsolesWithdrawn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st := storetest.Open(t, store.SQLite)
	e := New(st, nil, slog.New(slog.DiscardHandler), Config{RelayConsoles: true})
	if err := st.Write(ctx, func(tx *store.Tx) error { return tx.ServerAlive(ctx, "alive-1", 0) }); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, c := range []struct{ name, server, state string }{
		{"ours", e.ID(), "queued"},
		{"a live server's", "alive-1", "queued"},
		{"any server's", "", "queued"},
		{"a gone server's", "gone-1", "queued"},
		{"a gone server's, taken", "gone-1", "running"},
	} {
		cmd := store.Command{Kind: "bmc.console", Args: `{"server":"` + c.server + `"}`, SiteID: "s1", RunsOn: "site", State: c.state, Reroutable: true}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.InsertCommand(ctx, &cmd) }); err != nil {
			t.Fatal(err)
		}
		ids[c.name] = cmd.ID
	}
	if _, err := e.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	for name, id := range ids {
		c, err := st.Command(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		withdrawn := c.State == "failed" && strings.Contains(c.Error, "is gone")
		if withdrawn != (name == "a gone server's") {
			t.Errorf("%s: %s %q", name, c.State, c.Error)
		}
	}
}
