package sim

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// commandCounts counts the node's commands by kind, and those with a query or an action by
// kind{query} and kind{action} as well: "bmc.bios", "bmc.query{firmware}", "bmc.power{cycle}".
func commandCounts(t *testing.T, st *store.Store, id string) map[string]int {
	t.Helper()
	cmds, err := st.Commands(context.Background(), id, 1000)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, c := range cmds {
		var args struct {
			Query  string `json:"query"`
			Action string `json:"action"`
		}
		_ = json.Unmarshal([]byte(c.Args), &args)
		n[c.Kind]++
		if args.Query != "" {
			n[c.Kind+"{"+args.Query+"}"]++
		}
		if args.Action != "" {
			n[c.Kind+"{"+args.Action+"}"]++
		}
	}
	return n
}

// A pool's firmware baseline is checked when a node is commissioned and when it is released:
// a node whose BMC reports other versions (or none for a component) fails with FIRMWARE_DRIFT
// and maintenance on, naming each difference; a node that matches goes on, and the versions
// are in its events. A pool without a baseline costs no query.
func TestFirmwareBaseline(t *testing.T) {
	cases := []struct {
		name      string
		baseline  map[string]string
		wantState string
		wantMsg   []string
		queries   int // firmware queries after enroll → ready
	}{
		{"no baseline", nil, "ready", nil, 0},
		{"met", map[string]string{"BIOS": SimFirmwareBIOS, "bmc": SimFirmwareBMC}, "ready", nil, 1},
		{"older BIOS", map[string]string{"BIOS": "sim-bios-2.0", "BMC": SimFirmwareBMC}, "failed",
			[]string{"BIOS: runs " + SimFirmwareBIOS + ", want sim-bios-2.0"}, 1},
		{"component not reported", map[string]string{"BIOS": SimFirmwareBIOS, "NIC.Slot.1-1-1": "22.36.1010"}, "failed",
			[]string{"NIC.Slot.1-1-1: not reported by the BMC (want 22.36.1010)"}, 1},
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
				if _, err := h.Metal.UpdatePool(ctx, h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish", FirmwareBaseline: c.baseline}); err != nil {
					t.Fatal(err)
				}
				ids, err := h.Enroll(ctx, "fw", 1)
				if err != nil {
					t.Fatal(err)
				}
				id := ids[0]
				n := rest(t, h, ids)[id]
				if n.State != c.wantState {
					t.Fatalf("after enroll: %s (%s %s), want %s", n.State, n.FaultCode, n.FaultMsg, c.wantState)
				}
				if c.wantState == "failed" {
					if n.FaultCode != string(provision.FaultFirmwareDrift) || !n.Maintenance || n.FailedFrom != "commissioning" {
						t.Errorf("failed with %s from %s, maintenance %t; want FIRMWARE_DRIFT from commissioning, maintenance on", n.FaultCode, n.FailedFrom, n.Maintenance)
					}
					for _, m := range c.wantMsg {
						if !strings.Contains(n.FaultMsg, m) {
							t.Errorf("fault %q does not say %q", n.FaultMsg, m)
						}
					}
				}
				if got := commandCounts(t, st, id)["bmc.query{firmware}"]; got != c.queries {
					t.Errorf("%d firmware queries, want %d", got, c.queries)
				}
				if c.queries > 0 && !hasEvent(t, st, id, "node.firmware", `"BIOS":"`+SimFirmwareBIOS+`"`) {
					t.Error("no node.firmware event with the versions")
				}
			})
		})
	}
}

// A machine whose firmware changed while it was leased (the baseline moved, or a lessee flashed
// it) is caught at the end of its release: the wipe is done and attested first, then the node
// fails with FIRMWARE_DRIFT; once the firmware (here: the baseline) is right, recover releases
// it to ready.
func TestFirmwareDriftAtRelease(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, err := Start(ctx, st, Config{}, engineConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	setBaseline := func(b map[string]string) {
		t.Helper()
		if _, err := h.Metal.UpdatePool(ctx, h.Admin, "default", store.PoolPolicy{HardwareProfile: "redfish", FirmwareBaseline: b}); err != nil {
			t.Fatal(err)
		}
	}
	setBaseline(map[string]string{"BIOS": SimFirmwareBIOS})
	ids, err := h.Enroll(ctx, "fwr", 1)
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
	setBaseline(map[string]string{"BIOS": "sim-bios-1.1"})
	if err := h.Apply(ctx, provision.VerbUndeploy, ids, metal.VerbInput{Reason: "tenant left", Wipe: "quick"}); err != nil {
		t.Fatal(err)
	}
	n := rest(t, h, ids)[id]
	if n.State != "failed" || n.FailedFrom != "releasing" || n.FaultCode != string(provision.FaultFirmwareDrift) {
		t.Fatalf("undeploy: %s from %s %s %s, want failed from releasing with FIRMWARE_DRIFT", n.State, n.FailedFrom, n.FaultCode, n.FaultMsg)
	}
	if !strings.Contains(n.FaultMsg, "BIOS: runs "+SimFirmwareBIOS+", want sim-bios-1.1") {
		t.Errorf("fault %q", n.FaultMsg)
	}
	// The wipe ran (and was attested) before the check.
	cmds, err := st.Commands(ctx, id, 1000)
	if err != nil {
		t.Fatal(err)
	}
	wipes := 0
	for _, c := range cmds {
		if c.Kind == "disk.wipe" && c.State == "succeeded" && len(c.ResultSig) > 0 {
			wipes++
		}
	}
	if wipes != 2 { // commissioning's and the release's
		t.Errorf("%d attested wipes, want 2", wipes)
	}
	setBaseline(map[string]string{"BIOS": SimFirmwareBIOS})
	if err := h.Apply(ctx, provision.VerbRecover, ids, metal.VerbInput{Reason: "firmware checked"}); err != nil {
		t.Fatal(err)
	}
	if n := rest(t, h, ids)[id]; n.State != "ready" {
		t.Fatalf("recover: %s %s %s", n.State, n.FaultCode, n.FaultMsg)
	}
}
