package engine

import (
	"context"
	"errors"
	"log/slog"
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
	hub := console.NewHub()
	g := New(st, nil, slog.New(slog.DiscardHandler), Config{Consoles: hub}).Gateway()
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
