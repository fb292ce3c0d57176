package engine

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// A node agent's claim writes nothing: it offers its node's ramdisk commands (once per
// connection), and its acknowledgement takes them (assigned, an attempt counted, delivered) in
// one write, gating a destructive one there. What was withdrawn after the offer, another
// node's or generation's agent, and a site agent cannot take it.
func TestNodeClaimOffersAndTheAckTakes(t *testing.T) {
	for _, engine := range storetest.Engines {
		t.Run(string(engine), func(t *testing.T) {
			ctx := context.Background()
			wipe := []workflow.Step{{Use: "disk.wipe", Args: map[string]string{"mode": "quick"}, Timeout: time.Hour}}
			setup := func(t *testing.T, policy bool) (*wfFixture, Agent, store.Command) {
				t.Helper()
				st := storetest.Open(t, engine)
				f := newWFFixture(t, st, "inspecting", "ready", wipe, nil, Config{})
				if policy {
					if err := st.Write(ctx, func(tx *store.Tx) error { return tx.SetApprovalPolicy(ctx, "installation", 1, "test") }); err != nil {
						t.Fatal(err)
					}
				}
				node := Agent{ID: "node:" + f.node.ID, Kind: "node", NodeID: f.node.ID, Generation: f.node.IdentityGeneration, ConnID: "boot-1"}
				if err := f.e.Connected(ctx, node, "v"); err != nil {
					t.Fatal(err)
				}
				f.run(t)
				cmds := f.commands(t, "disk.wipe")
				if len(cmds) != 1 || cmds[0].State != "queued" {
					t.Fatalf("commands %+v: want one queued disk.wipe", cmds)
				}
				return f, node, cmds[0]
			}

			t.Run("offered, then taken by the acknowledgement", func(t *testing.T) {
				f, node, wipeCmd := setup(t, false)
				before := f.st.WriterStats().Writes
				got, err := f.e.Claim(ctx, node, 10)
				if err != nil || len(got) != 1 || got[0].ID != wipeCmd.ID {
					t.Fatalf("claim: %+v %v; want the wipe", got, err)
				}
				if engine == store.SQLite && f.st.WriterStats().Writes != before {
					t.Fatalf("the claim wrote: %d writes, want %d", f.st.WriterStats().Writes, before)
				}
				if c := f.commands(t, "disk.wipe")[0]; c.State != "queued" || c.TargetAgent != "" || c.Attempts != 0 {
					t.Fatalf("after the claim: %s, agent %q, %d attempts; want queued, unassigned, none", c.State, c.TargetAgent, c.Attempts)
				}
				if again, err := f.e.Claim(ctx, node, 10); err != nil || len(again) != 0 {
					t.Fatalf("a second claim on the connection: %d commands %v; want none (offered once)", len(again), err)
				}
				// Not this agent's: another node's, a revoked generation's, a site agent.
				other := node
				other.ID, other.NodeID = "node:other", "other"
				old := node
				old.Generation--
				for _, a := range []Agent{other, old, f.site} {
					if err := f.e.Ack(ctx, a, wipeCmd.ID); !errors.Is(err, ErrNotYours) {
						t.Errorf("ack by %s (generation %d): %v, want ErrNotYours", a.ID, a.Generation, err)
					}
				}
				if c := f.commands(t, "disk.wipe")[0]; c.State != "queued" || c.TargetAgent != "" {
					t.Fatalf("after refused acks: %s, agent %q", c.State, c.TargetAgent)
				}
				if err := f.e.Ack(ctx, node, wipeCmd.ID); err != nil {
					t.Fatalf("ack: %v", err)
				}
				c := f.commands(t, "disk.wipe")[0]
				if c.State != "delivered" || c.TargetAgent != node.ID || c.Attempts != 1 || c.DeliveredAt == 0 {
					t.Fatalf("after the ack: %s, agent %q, %d attempts, delivered at %d; want delivered to %s, 1 attempt",
						c.State, c.TargetAgent, c.Attempts, c.DeliveredAt, node.ID)
				}
				// Acknowledged again (an agent back from a restart): accepted, still one attempt.
				if err := f.e.Ack(ctx, node, wipeCmd.ID); err != nil {
					t.Fatalf("second ack: %v", err)
				}
				if c := f.commands(t, "disk.wipe")[0]; c.Attempts != 1 {
					t.Fatalf("attempts %d after a second ack, want 1", c.Attempts)
				}
			})

			t.Run("withdrawn after the offer", func(t *testing.T) {
				f, node, wipeCmd := setup(t, false)
				if got, err := f.e.Claim(ctx, node, 10); err != nil || len(got) != 1 {
					t.Fatalf("claim: %d %v", len(got), err)
				}
				err := f.st.Write(ctx, func(tx *store.Tx) error {
					closed, _, err := tx.WithdrawCommand(ctx, wipeCmd.ID, "withdrawn by the test")
					if err == nil && !closed {
						err = errors.New("not withdrawn")
					}
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := f.e.Ack(ctx, node, wipeCmd.ID); !errors.Is(err, ErrFinished) {
					t.Fatalf("ack of a withdrawn command: %v, want ErrFinished", err)
				}
				if c := f.commands(t, "disk.wipe")[0]; c.State != "failed" || c.DeliveredAt != 0 {
					t.Fatalf("withdrawn command after the ack: %s, delivered at %d", c.State, c.DeliveredAt)
				}
			})

			t.Run("a destructive command is gated at the acknowledgement", func(t *testing.T) {
				f, node, wipeCmd := setup(t, true)
				if got, err := f.e.Claim(ctx, node, 10); err != nil || len(got) != 1 {
					t.Fatalf("claim: %d %v", len(got), err)
				}
				if err := f.e.Ack(ctx, node, wipeCmd.ID); !errors.Is(err, ErrFinished) {
					t.Fatalf("ack of a wipe outside any batch under a policy: %v, want ErrFinished (refused)", err)
				}
				c := f.commands(t, "disk.wipe")[0]
				if c.State != "failed" || !strings.Contains(c.Error, "outside any batch") || c.DeliveredAt != 0 {
					t.Fatalf("the wipe: %s %q, delivered at %d; want failed, outside any batch, never delivered", c.State, c.Error, c.DeliveredAt)
				}
				if len(eventsOf(t, f.st, f.node.ID, "command.refused")) != 1 {
					t.Fatal("the refusal was not recorded")
				}
			})
		})
	}
}
