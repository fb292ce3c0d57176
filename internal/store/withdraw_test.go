package store_test

import (
	"context"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A workflow taking a node withdraws the operator's direct commands still waiting (a power
// action), but not a credential rotation (it settles itself) nor a console session (it runs
// beside workflows), nor anything an agent took or a workflow sent.
func TestWithdrawDirectCommandsSparesConsoles(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		n := nodes[0]
		ids := map[string]string{}
		for _, c := range []struct{ name, kind, state, workflow string }{
			{"power", "bmc.power", "queued", ""},
			{"held power", "bmc.power", "held", ""},
			{"console", "bmc.console", "queued", ""},
			{"rotation", "bmc.rotate", "queued", ""},
			{"taken power", "bmc.power", "delivered", ""},
			{"workflow's", "bmc.power", "queued", "wf-1"},
		} {
			cmd := store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: c.kind, Args: "{}", RunsOn: "site", State: c.state, WorkflowID: c.workflow}
			if err := st.Write(ctx, func(tx *store.Tx) error { return tx.InsertCommand(ctx, &cmd) }); err != nil {
				t.Fatal(err)
			}
			ids[c.name] = cmd.ID
		}
		var withdrawn [][2]string
		if err := st.Write(ctx, func(tx *store.Tx) error {
			var err error
			withdrawn, err = tx.WithdrawDirectCommands(ctx, n.ID, "withdrawn by the test")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, w := range withdrawn {
			got[w[0]] = true
		}
		for name, id := range ids {
			want := name == "power" || name == "held power"
			if got[id] != want {
				t.Errorf("%s: withdrawn %v, want %v", name, got[id], want)
			}
		}
	})
}
