package metal

import (
	"context"
	"errors"
	"strings"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestBootModeEnrollAndUpdate: the boot mode is validated (the error lists what is accepted),
// stored at enroll, changed by update with an event, and cleared by an empty value.
func TestBootModeEnrollAndUpdate(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newFixture(t, st)
		for _, bad := range []string{"bios", "UEFI", "unchanged"} {
			in := enrollInput("bad-"+strings.ToLower(bad), "52:54:00:aa:bb:0f")
			in.BootMode = bad
			_, err := f.svc.Enroll(ctx, f.admin, in)
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != "boot_mode" || !strings.Contains(err.Error(), "accepted are uefi, legacy, or empty") {
				t.Errorf("enroll with boot mode %q: %v", bad, err)
			}
		}
		in := enrollInput("legacy-1", "52:54:00:aa:bb:01")
		in.BootMode = "legacy"
		n, err := f.svc.Enroll(ctx, f.admin, in)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := st.Node(ctx, n.ID, ""); err != nil || got.BootMode != "legacy" {
			t.Fatalf("stored boot mode %q, %v; want legacy", got.BootMode, err)
		}
		plain, err := f.svc.Enroll(ctx, f.admin, enrollInput("plain-1", "52:54:00:aa:bb:02"))
		if err != nil || plain.BootMode != "" {
			t.Fatalf("enroll without boot mode: %q, %v", plain.BootMode, err)
		}

		str := func(s string) *string { return &s }
		tests := []struct {
			name    string
			node    string
			mode    *string
			want    string // stored mode after the update
			errHas  string // "" for success
			version uint64 // expected version bump (0 or 1)
		}{
			{"to uefi", "legacy-1", str("uefi"), "uefi", "", 1},
			{"same again changes nothing", "legacy-1", str("uefi"), "uefi", "", 0},
			{"cleared", "legacy-1", str(""), "", "", 1},
			{"invalid", "legacy-1", str("efi"), "", "accepted are uefi, legacy, or empty", 0},
			{"nothing given", "legacy-1", nil, "", "nothing to update", 0},
			{"unknown node", "nope", str("legacy"), "", "not found", 0},
			{"plain to legacy", "plain-1", str("legacy"), "legacy", "", 1},
		}
		for _, tt := range tests {
			before, _ := st.Node(ctx, tt.node, "")
			got, err := f.svc.Update(ctx, f.admin, UpdateInput{Node: tt.node, BootMode: tt.mode, Reason: "firmware is legacy BIOS"})
			if tt.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Errorf("%s: err %v, want it to say %q", tt.name, err, tt.errHas)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", tt.name, err)
			}
			stored, _ := st.Node(ctx, tt.node, "")
			if got.BootMode != tt.want || stored.BootMode != tt.want || stored.Version != before.Version+tt.version {
				t.Errorf("%s: returned %q, stored %q at version %d (was %d); want %q", tt.name, got.BootMode, stored.BootMode, stored.Version, before.Version, tt.want)
			}
		}
		evs, err := st.Events(ctx, store.EventFilter{NodeID: n.ID, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		var updates []string
		for _, e := range evs {
			if e.Kind == "node.update" {
				updates = append(updates, e.Data)
			}
		}
		if len(updates) != 2 || !strings.Contains(updates[0], `"from":"legacy"`) || !strings.Contains(updates[0], `"to":"uefi"`) {
			t.Errorf("node.update events %q: want two, the first legacy → uefi", updates)
		}
	})
}

// TestValidBMCAddressRedfishSystem: a Redfish address may name the node's ComputerSystem by the
// path /redfish/v1/Systems/ID and by no other path.
func TestValidBMCAddressRedfishSystem(t *testing.T) {
	tests := []struct {
		addr, want string
		errHas     string
	}{
		{"https://10.0.0.5/redfish/v1/Systems/Node2", "https://10.0.0.5/redfish/v1/Systems/Node2", ""},
		{"https://10.0.0.5:8443/redfish/v1/Systems/System.Embedded.1/", "https://10.0.0.5:8443/redfish/v1/Systems/System.Embedded.1", ""},
		{"https://10.0.0.5/", "https://10.0.0.5", ""},
		{"https://10.0.0.5/redfish/v1", "", "/redfish/v1/Systems/ID"},
		{"https://10.0.0.5/redfish/v1/Systems", "", "/redfish/v1/Systems/ID"},
		{"https://10.0.0.5/redfish/v1/Systems/Node2/Bios", "", "/redfish/v1/Systems/ID"},
		{"https://10.0.0.5/redfish/v1/Managers/1", "", "/redfish/v1/Systems/ID"},
		{"https://10.0.0.5/redfish/v1/Systems/..", "", "/redfish/v1/Systems/ID"},
		{"https://10.0.0.5/redfish/v1/Systems/1?x=1", "", "without user or query"},
		{"https://root:pw@10.0.0.5/redfish/v1/Systems/1", "", "must not carry credentials"},
	}
	for _, tt := range tests {
		got, err := ValidBMCAddress("redfish", tt.addr)
		if tt.errHas != "" {
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != "bmc.address" || !strings.Contains(err.Error(), tt.errHas) {
				t.Errorf("ValidBMCAddress(%s) = %q, %v; want an error on bmc.address saying %q", tt.addr, got, err, tt.errHas)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ValidBMCAddress(%s) = %q, %v; want %q", tt.addr, got, err, tt.want)
		}
	}
	// IPMI addresses take no path at all.
	if _, err := ValidBMCAddress("ipmi", "10.0.0.5/redfish/v1/Systems/1"); err == nil {
		t.Error("an IPMI address with a path was accepted")
	}
}
