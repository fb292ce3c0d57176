package sim

import (
	"context"
	"strings"
	"testing"

	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A pool's BIOS settings are written when a node is commissioned, and read back after the boot
// that applies them. Written settings make the node boot anew (the enroll chain's ramdisk,
// lingering from inspection, was up before the write: its BIOS does not have them yet); settings
// already in place write nothing and keep the fast track. An attribute the BMC does not have
// fails the node, naming it. A pool without settings sends neither command.
func TestBIOSSettings(t *testing.T) {
	cases := []struct {
		name      string
		settings  map[string]string
		wantState string
		wantMsg   string
		// bmc.bios commands, those that wrote settings, BIOS queries, power cycles after
		// enroll → ready.
		commands, written, queries, cycles int
	}{
		{"no settings", nil, "ready", "", 0, 0, 0, 1},
		{"written", map[string]string{"ProcVirtualization": "Disabled", "SriovGlobalEnable": "Enabled", "ProcCStates": "Enabled"}, "ready", "", 1, 1, 1, 2},
		{"already in place", map[string]string{"ProcCStates": "Enabled", "ProcCoreDisable": "0"}, "ready", "", 1, 0, 1, 1},
		{"unknown attribute", map[string]string{"ProcVirtualization": "Disabled", "NoSuchKnob": "On"}, "failed", "does not report attribute NoSuchKnob", 3, 0, 0, 1}, // bios.apply and its 2 retries
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				h, err := Start(ctx, st, Config{}, engineConfig(), nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(h.Stop)
				if _, err := h.Metal.UpdatePool(ctx, h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish", BIOSSettings: c.settings}); err != nil {
					t.Fatal(err)
				}
				ids, err := h.Enroll(ctx, "bios", 1)
				if err != nil {
					t.Fatal(err)
				}
				id := ids[0]
				n := rest(t, h, ids)[id]
				if n.State != c.wantState {
					t.Fatalf("after enroll: %s (%s %s), want %s", n.State, n.FaultCode, n.FaultMsg, c.wantState)
				}
				if c.wantState == "failed" && (n.FaultCode != string(provision.FaultStepFailed) || n.FailedFrom != "commissioning" || !strings.Contains(n.FaultMsg, c.wantMsg)) {
					t.Errorf("failed with %s from %s: %q; want STEP_FAILED from commissioning saying %q", n.FaultCode, n.FailedFrom, n.FaultMsg, c.wantMsg)
				}
				m := h.Sim.Machine(id)
				m.mu.Lock()
				bios, writes := m.bios(), m.BIOSWrites
				for name, want := range c.settings {
					if c.wantState == "ready" && bios[name] != want {
						t.Errorf("BIOS attribute %s is %q, want %q", name, bios[name], want)
					}
				}
				m.mu.Unlock()
				if writes != c.written {
					t.Errorf("%d BIOS writes, want %d", writes, c.written)
				}
				counts := commandCounts(t, st, id)
				cmds, queries, cycles := counts["bmc.bios"], counts["bmc.query{bios}"], counts["bmc.power{cycle}"]
				if cmds != c.commands || queries != c.queries || cycles != c.cycles {
					t.Errorf("%d bmc.bios, %d BIOS queries, %d power cycles; want %d, %d, %d", cmds, queries, cycles, c.commands, c.queries, c.cycles)
				}
				if c.queries > 0 && !hasEvent(t, st, id, "node.bios", `"drift":null`) {
					t.Error("no node.bios event with the values read back")
				}
			})
		})
	}
}

// A lessee who changed the BIOS is put back at release: the pool's settings are written again
// and read back after the release's boot. A BMC that takes the write and never applies it is
// caught there: the node fails with BIOS_DRIFT, naming the attribute; once the BMC applies
// settings again, recover releases it to ready.
func TestBIOSDriftAtRelease(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, err := Start(ctx, st, Config{}, engineConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	settings := map[string]string{"ProcVirtualization": "Disabled"}
	if _, err := h.Metal.UpdatePool(ctx, h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish", BIOSSettings: settings}); err != nil {
		t.Fatal(err)
	}
	ids, err := h.Enroll(ctx, "biosr", 1)
	if err != nil {
		t.Fatal(err)
	}
	id := ids[0]
	if n := rest(t, h, ids)[id]; n.State != "ready" {
		t.Fatalf("enroll: %s %s", n.State, n.FaultMsg)
	}
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"}); err != nil {
		t.Fatal(err)
	}
	if n := rest(t, h, ids)[id]; n.State != "deployed" {
		t.Fatalf("deploy: %s %s", n.State, n.FaultMsg)
	}
	m := h.Sim.Machine(id)
	setMachine := func(f func()) {
		m.mu.Lock()
		defer m.mu.Unlock()
		f()
	}
	// The lessee turns virtualization back on; the BMC then stops applying settings.
	setMachine(func() { m.bios()["ProcVirtualization"], m.IgnoreBIOSSettings = "Enabled", true })
	if err := h.Apply(ctx, provision.VerbUndeploy, ids, metal.VerbInput{Reason: "tenant left", Wipe: "quick"}); err != nil {
		t.Fatal(err)
	}
	n := rest(t, h, ids)[id]
	if n.State != "failed" || n.FailedFrom != "releasing" || n.FaultCode != string(provision.FaultBIOSDrift) {
		t.Fatalf("undeploy: %s from %s %s %s, want failed from releasing with BIOS_DRIFT", n.State, n.FailedFrom, n.FaultCode, n.FaultMsg)
	}
	if !strings.Contains(n.FaultMsg, "ProcVirtualization: is Enabled, want Disabled") {
		t.Errorf("fault %q", n.FaultMsg)
	}
	setMachine(func() { m.IgnoreBIOSSettings = false })
	if err := h.Apply(ctx, provision.VerbRecover, ids, metal.VerbInput{Reason: "BMC fixed"}); err != nil {
		t.Fatal(err)
	}
	if n := rest(t, h, ids)[id]; n.State != "ready" {
		t.Fatalf("recover: %s %s %s", n.State, n.FaultCode, n.FaultMsg)
	}
	setMachine(func() {
		if got := m.bios()["ProcVirtualization"]; got != "Disabled" {
			t.Errorf("after the release: ProcVirtualization %s, want Disabled", got)
		}
		// Commissioning's write, the release's (not applied), recover's release's.
		if m.BIOSWrites != 3 {
			t.Errorf("%d BIOS writes, want 3", m.BIOSWrites)
		}
	})
}
