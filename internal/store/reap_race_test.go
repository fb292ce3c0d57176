package store_test

import (
	"context"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A departed agent's commands are released or declared lost only as they were read: on
// PostgreSQL the agent, back on another connection, may acknowledge one between the reaper's
// read and its write, and that acknowledgement stands (the command is not released to another
// agent, which would run it a second time). SQLite's single writer cannot interleave them.
func TestReleaseLeavesWhatItsAgentDidMeanwhile(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		if st.Engine() == store.SQLite {
			t.Skip("one writer: nothing commits between the reaper's read and its write")
		}
		ctx := context.Background()
		_, nodes := seed(t, st)
		var acked, other store.Command
		if err := st.Write(ctx, func(tx *store.Tx) error {
			for _, c := range []*store.Command{&acked, &other} {
				*c = store.Command{NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, SiteID: nodes[0].SiteID, Kind: "bmc.query", Args: "{}", RunsOn: "site", TargetAgent: "a"}
				if err := tx.InsertCommand(ctx, c); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var applied []store.Command
		err := st.Write(ctx, func(tx *store.Tx) error {
			var err error
			applied, err = tx.ReleaseAgentCommands(ctx, "a", func(c store.Command) (string, bool) {
				if c.ID == acked.ID {
					// The agent, back, acknowledges it now, in a transaction of its own.
					if err := st.Write(ctx, func(tx *store.Tx) error {
						_, err := tx.DeliverCommands(ctx, []string{acked.ID}, store.Acknowledger{AgentID: "a"})
						return err
					}); err != nil {
						t.Errorf("acknowledging: %v", err)
					}
				}
				return "queued", true // unacknowledged, as read: released
			})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(applied) != 1 || applied[0].ID != other.ID {
			t.Errorf("applied %d commands, want only the one nobody touched", len(applied))
		}
		got, err := st.Command(ctx, acked.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != "delivered" || got.TargetAgent != "a" {
			t.Fatalf("the command acknowledged meanwhile: %s for %q, want delivered for a", got.State, got.TargetAgent)
		}
		if got, _ := st.Command(ctx, other.ID); got.State != "queued" || got.TargetAgent != "" {
			t.Fatalf("the other command: %s for %q, want queued for no agent", got.State, got.TargetAgent)
		}
	})
}
