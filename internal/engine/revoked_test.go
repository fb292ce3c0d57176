package engine

import (
	"context"
	"errors"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A command is an agent's when it is assigned to it and, for a node's agents, of its identity
// generation: a node agent's id names the node only.
func TestAgentsCommand(t *testing.T) {
	site := Agent{ID: "a1", Kind: "site"}
	gen1 := Agent{ID: "node:n", Kind: "node", NodeID: "n", Generation: 1}
	gen2 := Agent{ID: "node:n", Kind: "node", NodeID: "n", Generation: 2}
	for _, tc := range []struct {
		name string
		a    Agent
		c    store.Command
		want bool
	}{
		{"site agent, its command", site, store.Command{TargetAgent: "a1", Generation: 7}, true},
		{"site agent, another's", site, store.Command{TargetAgent: "a2"}, false},
		{"ramdisk, its generation", gen2, store.Command{TargetAgent: "node:n", Generation: 2}, true},
		{"revoked ramdisk, the new generation's command", gen1, store.Command{TargetAgent: "node:n", Generation: 2}, false},
		{"ramdisk, another node's", gen2, store.Command{TargetAgent: "node:m", Generation: 2}, false},
	} {
		if got := agentsCommand(tc.a, tc.c); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A ramdisk whose generation was revoked, on a stream opened before, can neither acknowledge
// nor report the new generation's commands (both engines).
func TestRevokedGenerationCannotActOnNewCommands(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		e := New(st, nil, nil, Config{})
		var id string
		if err := st.Write(ctx, func(tx *store.Tx) error {
			c := store.Command{NodeID: "n", SiteID: "s", Kind: "inventory.refresh", Args: "{}", RunsOn: "ramdisk", TargetAgent: "node:n", Generation: 2}
			if err := tx.InsertCommand(ctx, &c); err != nil {
				return err
			}
			id = c.ID
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		stale := Agent{ID: "node:n", Kind: "node", NodeID: "n", Generation: 1}
		if err := e.Ack(ctx, stale, id); !errors.Is(err, ErrNotYours) {
			t.Fatalf("ack by the revoked generation: %v", err)
		}
		if err := e.Report(ctx, stale, Update{CommandID: id, State: "failed", Error: "forged"}); !errors.Is(err, ErrNotYours) {
			t.Fatalf("report by the revoked generation: %v", err)
		}
		if c, _ := st.Command(ctx, id); c.State != "queued" {
			t.Fatalf("the command is %s after the revoked generation's attempts", c.State)
		}
		current := Agent{ID: "node:n", Kind: "node", NodeID: "n", Generation: 2}
		if err := e.Ack(ctx, current, id); err != nil {
			t.Fatalf("ack by the current generation: %v", err)
		}
	})
}
