package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// A site agent's claim writes nothing for a command that makes no boot entry: it offers it
// (once per connection, and not to the site's other agents on this server while its connection
// lives), and its acknowledgement takes it (assigned, an attempt counted, delivered) in one
// write. What it was offered and did not acknowledge is the other agents' once it leaves; what
// another agent took, or was withdrawn since, its acknowledgement cannot take; what it acknowledges
// again from its journal on a new connection (restarted) it takes. A command that makes a boot
// entry is still assigned by the claim, with its entry.
func TestSiteClaimOffersAndTheAckTakes(t *testing.T) {
	for _, engine := range storetest.Engines {
		t.Run(string(engine), func(t *testing.T) {
			ctx := context.Background()
			query := []workflow.Step{{Use: "power.getPower", Timeout: time.Hour}}
			setup := func(t *testing.T, steps []workflow.Step, kind string) (*wfFixture, Agent, store.Command) {
				t.Helper()
				f := newWFFixture(t, storetest.Open(t, engine), "inspecting", "ready", steps, nil, Config{})
				b := Agent{ID: "site-b1", Kind: "site", SiteID: f.node.SiteID, ConnID: "conn-b"}
				for _, a := range []Agent{f.site, b} {
					if err := f.e.Connected(ctx, a, "v"); err != nil {
						t.Fatal(err)
					}
				}
				f.run(t)
				cmds := f.commands(t, kind)
				if len(cmds) != 1 || cmds[0].State != "queued" {
					t.Fatalf("commands %+v: want one queued %s", cmds, kind)
				}
				return f, b, cmds[0]
			}
			is := func(t *testing.T, f *wfFixture, id, state, agent string, attempts int) {
				t.Helper()
				c, err := f.st.Command(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if c.State != state || c.TargetAgent != agent || c.Attempts != attempts {
					t.Fatalf("command %s: %s on %q, %d attempts; want %s on %q, %d", c.Kind, c.State, c.TargetAgent, c.Attempts, state, agent, attempts)
				}
			}

			t.Run("offered to one agent, taken by its acknowledgement", func(t *testing.T) {
				f, b, cmd := setup(t, query, "bmc.query")
				a := f.site
				before := f.st.WriterStats().Writes
				if got, err := f.e.Claim(ctx, a, 10); err != nil || len(got) != 1 || got[0].ID != cmd.ID {
					t.Fatalf("claim by A: %+v %v; want the query", got, err)
				}
				if engine == store.SQLite && f.st.WriterStats().Writes != before {
					t.Fatalf("the claim wrote: %d writes, want %d", f.st.WriterStats().Writes, before)
				}
				is(t, f, cmd.ID, "queued", "", 0)
				if again, err := f.e.Claim(ctx, a, 10); err != nil || len(again) != 0 {
					t.Fatalf("A's second claim: %d commands %v; want none (offered once)", len(again), err)
				}
				if got, err := f.e.Claim(ctx, b, 10); err != nil || len(got) != 0 {
					t.Fatalf("B's claim while A lives: %d commands %v; want none", len(got), err)
				}
				if err := f.e.Ack(ctx, b, cmd.ID); !errors.Is(err, ErrNotYours) {
					t.Fatalf("B's ack of what A was offered: %v, want ErrNotYours", err)
				}
				is(t, f, cmd.ID, "queued", "", 0)
				if err := f.e.Ack(ctx, a, cmd.ID); err != nil {
					t.Fatalf("A's ack: %v", err)
				}
				is(t, f, cmd.ID, "delivered", a.ID, 1)
				if err := f.e.Ack(ctx, a, cmd.ID); err != nil {
					t.Fatalf("A's second ack: %v", err)
				}
				is(t, f, cmd.ID, "delivered", a.ID, 1)
			})

			t.Run("not acknowledged: the site's other agent takes it once the first leaves", func(t *testing.T) {
				f, b, cmd := setup(t, query, "bmc.query")
				a := f.site
				if got, err := f.e.Claim(ctx, a, 10); err != nil || len(got) != 1 {
					t.Fatalf("claim by A: %d %v", len(got), err)
				}
				onB, endB := f.e.Subscribe(b)
				defer endB()
				if err := f.e.Disconnected(ctx, a); err != nil {
					t.Fatal(err)
				}
				select {
				case <-onB:
				default:
					t.Fatal("A's departure did not wake the site's other agent")
				}
				if got, err := f.e.Claim(ctx, b, 10); err != nil || len(got) != 1 || got[0].ID != cmd.ID {
					t.Fatalf("B's claim after A left: %+v %v; want the query", got, err)
				}
				if err := f.e.Ack(ctx, b, cmd.ID); err != nil {
					t.Fatalf("B's ack: %v", err)
				}
				is(t, f, cmd.ID, "delivered", b.ID, 1)
				back := a
				back.ConnID = "conn-2"
				if err := f.e.Connected(ctx, back, "v"); err != nil {
					t.Fatal(err)
				}
				if err := f.e.Ack(ctx, back, cmd.ID); !errors.Is(err, ErrNotYours) {
					t.Fatalf("A's ack, back on a new connection, of what B took: %v, want ErrNotYours", err)
				}
			})

			t.Run("acknowledged again after a restart, on a new connection: taken", func(t *testing.T) {
				f, _, cmd := setup(t, query, "bmc.query")
				a := f.site
				if got, err := f.e.Claim(ctx, a, 10); err != nil || len(got) != 1 {
					t.Fatalf("claim by A: %d %v", len(got), err)
				}
				// It journaled the command and crashed before its ack was answered.
				if err := f.e.Disconnected(ctx, a); err != nil {
					t.Fatal(err)
				}
				if err := f.e.Ack(ctx, a, cmd.ID); !errors.Is(err, ErrNotYours) {
					t.Fatalf("ack on the departed connection: %v, want ErrNotYours", err)
				}
				back := a
				back.ConnID = "conn-2"
				if err := f.e.Connected(ctx, back, "v"); err != nil {
					t.Fatal(err)
				}
				if err := f.e.Ack(ctx, back, cmd.ID); err != nil {
					t.Fatalf("ack from the journal on the new connection: %v", err)
				}
				is(t, f, cmd.ID, "delivered", a.ID, 1)
			})

			t.Run("offered by two servers: the first acknowledgement takes it", func(t *testing.T) {
				f, b, cmd := setup(t, query, "bmc.query")
				a := f.site
				other := New(f.st, nil, nil, Config{AgentGrace: time.Second})
				if err := other.Connected(ctx, b, "v"); err != nil {
					t.Fatal(err)
				}
				if got, err := f.e.Claim(ctx, a, 10); err != nil || len(got) != 1 {
					t.Fatalf("claim by A: %d %v", len(got), err)
				}
				if got, err := other.Claim(ctx, b, 10); err != nil || len(got) != 1 {
					t.Fatalf("claim by B on the other server: %d %v", len(got), err)
				}
				if err := f.e.Ack(ctx, a, cmd.ID); err != nil {
					t.Fatalf("A's ack: %v", err)
				}
				if err := other.Ack(ctx, b, cmd.ID); !errors.Is(err, ErrNotYours) {
					t.Fatalf("B's ack after A's: %v, want ErrNotYours", err)
				}
				is(t, f, cmd.ID, "delivered", a.ID, 1)
			})

			t.Run("withdrawn after the offer", func(t *testing.T) {
				f, _, cmd := setup(t, query, "bmc.query")
				a := f.site
				if got, err := f.e.Claim(ctx, a, 10); err != nil || len(got) != 1 {
					t.Fatalf("claim: %d %v", len(got), err)
				}
				err := f.st.Write(ctx, func(tx *store.Tx) error {
					closed, _, err := tx.WithdrawCommand(ctx, cmd.ID, "withdrawn by the test")
					if err == nil && !closed {
						err = errors.New("not withdrawn")
					}
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := f.e.Ack(ctx, a, cmd.ID); !errors.Is(err, ErrFinished) {
					t.Fatalf("ack of a withdrawn command: %v, want ErrFinished", err)
				}
				is(t, f, cmd.ID, "failed", "", 0)
			})

			t.Run("a boot entry's command is assigned by the claim", func(t *testing.T) {
				f, b, cmd := setup(t, []workflow.Step{{Use: "boot.prepareRamdisk", Timeout: time.Hour}}, "boot.prepareRamdisk")
				a := f.site
				if got, err := f.e.Claim(ctx, a, 10); err != nil || len(got) != 1 || got[0].ID != cmd.ID {
					t.Fatalf("claim: %+v %v", got, err)
				}
				is(t, f, cmd.ID, "queued", a.ID, 1)
				if got, err := f.e.Claim(ctx, b, 10); err != nil || len(got) != 0 {
					t.Fatalf("B's claim: %d commands %v; want none", len(got), err)
				}
				if err := f.e.Ack(ctx, a, cmd.ID); err != nil {
					t.Fatalf("ack: %v", err)
				}
				is(t, f, cmd.ID, "delivered", a.ID, 1)
			})
		})
	}
}
