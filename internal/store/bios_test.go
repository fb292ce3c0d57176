package store_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"bcd/internal/bmc"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestBIOSWriteCountsAsBoot: a bmc.bios that wrote settings, or a bmc.firmware that installed
// an image, counts as the node's last boot command (they wait for a reset: a ramdisk up before
// it is not used as it is); one that found nothing to do, or has no result yet, does not, nor
// does another kind whatever its result says.
func TestBIOSWriteCountsAsBoot(t *testing.T) {
	wrote, err := json.Marshal(bmc.BIOSWriteResult{Changed: []string{"ProcCStates"}, Pending: true})
	if err != nil {
		t.Fatal(err)
	}
	same, err := json.Marshal(bmc.BIOSWriteResult{Changed: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(wrote), store.PendingMark) || strings.Contains(string(same), store.PendingMark) {
		t.Fatalf("PendingMark %s does not tell %s from %s", store.PendingMark, wrote, same)
	}
	flashed, err := json.Marshal(bmc.FirmwareUpdateResult{Updated: []string{"BIOS"}, Pending: true})
	if err != nil {
		t.Fatal(err)
	}
	current, err := json.Marshal(bmc.FirmwareUpdateResult{Updated: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(flashed), store.PendingMark) || strings.Contains(string(current), store.PendingMark) {
		t.Fatalf("PendingMark %s does not tell %s from %s", store.PendingMark, flashed, current)
	}
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		n := nodes[0]
		cmd := func(kind, state, result string) store.Command {
			return store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: kind, Subject: "bmc:" + n.BMCAddress, Args: "{}",
				RunsOn: "site", State: state, Result: result, Generation: n.IdentityGeneration}
		}
		bios := func(state, result string) store.Command { return cmd("bmc.bios", state, result) }
		firmware := func(state, result string) store.Command { return cmd("bmc.firmware", state, result) }
		var written int64 // when the command that wrote settings was made
		for _, tc := range []struct {
			name   string
			c      store.Command
			writes bool
		}{
			{"queued, no result", bios("queued", ""), false},
			{"nothing to write", bios("succeeded", string(same)), false},
			{"settings written", bios("succeeded", string(wrote)), true},
			{"nothing to write after", bios("succeeded", string(same)), false},
			{"firmware queued", firmware("queued", ""), false},
			{"firmware current", firmware("succeeded", string(current)), false},
			{"firmware installed", firmware("succeeded", string(flashed)), true},
			{"a query after", cmd("bmc.query", "succeeded", string(wrote)), false},
		} {
			var got int64
			err := st.Write(ctx, func(tx *store.Tx) error {
				c := tc.c
				if err := tx.InsertCommand(ctx, &c); err != nil {
					return err
				}
				if tc.writes {
					written = c.CreatedAt
				}
				var err error
				got, err = tx.LastBootCommandAt(ctx, n.ID)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if got != written || tc.writes && got == 0 {
				t.Errorf("%s: last boot command at %d, want %d", tc.name, got, written)
			}
		}
	})
}
