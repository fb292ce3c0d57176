package engine_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/sim"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestNodeBootModeReachesTheBMC: with the built-in profiles (enroll → inspect → commission →
// deploy), every setBootDevice command of a node enrolled with bootMode legacy carries mode
// legacy (pxe and disk alike); a node enrolled without one, as before, carries none; after an
// update to uefi, the next commands carry uefi.
func TestNodeBootModeReachesTheBMC(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, err := sim.Start(ctx, st, sim.Config{}, engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.Stop)
		nodes := []struct {
			name, mode, mac, uuid string
		}{
			{"legacy-0", "legacy", "02:b0:00:00:00:01", "00000001-00b0-4000-8000-000000000001"},
			{"plain-0", "", "02:b0:00:00:00:02", "00000002-00b0-4000-8000-000000000002"},
		}
		ids := make([]string, len(nodes))
		for i, n := range nodes {
			node, err := h.Metal.Enroll(ctx, h.Admin, metal.EnrollInput{Name: n.name, Pool: "default", MACs: []string{n.mac}, ProductUUID: n.uuid,
				BootMode: n.mode, BMC: metal.BMCInput{Address: "https://10.9.0.1", Username: "admin", Password: "sim-password"}})
			if err != nil {
				t.Fatal(err)
			}
			h.Sim.Add(&sim.Machine{NodeID: node.ID, UUID: n.uuid, MACs: []string{n.mac}})
			ids[i] = node.ID
		}
		rest := func() {
			t.Helper()
			got, err := h.WaitRest(ctx, ids, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			for id, n := range got {
				if n.State == "failed" {
					t.Fatalf("node %s failed: %s %s", id, n.FaultCode, n.FaultMsg)
				}
			}
		}
		rest()
		if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"}); err != nil {
			t.Fatal(err)
		}
		rest()
		// bootModes lists the (device, mode) of the node's bmc.boot commands created after since.
		bootModes := func(id string, since int64) [][2]string {
			t.Helper()
			cmds, err := st.Commands(ctx, id, 1000)
			if err != nil {
				t.Fatal(err)
			}
			var out [][2]string
			for _, c := range cmds {
				if c.Kind != "bmc.boot" || c.CreatedAt <= since {
					continue
				}
				var a struct{ Device, Mode string }
				if err := json.Unmarshal([]byte(c.Args), &a); err != nil {
					t.Fatal(err)
				}
				out = append(out, [2]string{a.Device, a.Mode})
			}
			return out
		}
		check := func(id, want string, since int64) {
			t.Helper()
			got := bootModes(id, since)
			devices := map[string]bool{}
			for _, b := range got {
				devices[b[0]] = true
				if b[1] != want {
					t.Errorf("node %s: setBootDevice{device: %s} carries mode %q, want %q (all: %v)", id, b[0], b[1], want, got)
				}
			}
			if !devices["pxe"] || !devices["disk"] {
				t.Errorf("node %s: bmc.boot commands %v, want pxe and disk ones", id, got)
			}
		}
		check(ids[0], "legacy", 0)
		check(ids[1], "", 0)

		// Update to uefi: the commands of the next deploy carry it.
		mode := "uefi"
		n, err := h.Metal.Update(ctx, h.Admin, metal.UpdateInput{Node: ids[0], BootMode: &mode, Reason: "firmware switched to UEFI"})
		if err != nil || n.BootMode != "uefi" {
			t.Fatalf("update: %q, %v", n.BootMode, err)
		}
		since := n.UpdatedAt
		if err := h.Apply(ctx, provision.VerbUndeploy, ids[:1], metal.VerbInput{}); err != nil {
			t.Fatal(err)
		}
		rest()
		if err := h.Apply(ctx, provision.VerbDeploy, ids[:1], metal.VerbInput{Image: "img"}); err != nil {
			t.Fatal(err)
		}
		rest()
		check(ids[0], "uefi", since)
	})
}
