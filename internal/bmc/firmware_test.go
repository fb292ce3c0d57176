package bmc

import (
	"slices"
	"testing"
)

// A baseline is met only by the exact versions it names, found by id first, then by name,
// ignoring case; every other component is reported, sorted, saying what runs and what is wanted.
func TestDrift(t *testing.T) {
	have := []Firmware{
		{ID: "Installed-159-2.17.1__BIOS.Setup.1-1", Name: "BIOS", Version: "2.17.1"},
		{ID: "1", Name: "System ROM", Version: "U46 v2.50 (03/01/2023)"},
		{ID: "BMC", Name: "Integrated Dell Remote Access Controller", Version: "6.10.30.00"},
		{ID: "NIC.Slot.1-1-1", Name: "Mellanox ConnectX-6", Version: "22.36.1010"},
		{ID: "cpld", Name: "CPLD", Version: "1.0.4"},
		{ID: "nic2", Name: "NIC.Slot.1-1-1", Version: "shadowed"},
	}
	cases := []struct {
		name     string
		baseline map[string]string
		want     []string
	}{
		{"no baseline", nil, nil},
		{"all met by id", map[string]string{"BMC": "6.10.30.00", "NIC.Slot.1-1-1": "22.36.1010"}, nil},
		{"met by name", map[string]string{"BIOS": "2.17.1", "System ROM": "U46 v2.50 (03/01/2023)"}, nil},
		{"case ignored in names", map[string]string{"bios": "2.17.1", "CPLD": "1.0.4", "bmc": "6.10.30.00"}, nil},
		{"id before name", map[string]string{"NIC.Slot.1-1-1": "shadowed"}, []string{"NIC.Slot.1-1-1: runs 22.36.1010, want shadowed"}},
		{"older", map[string]string{"BIOS": "2.18.0"}, []string{"BIOS: runs 2.17.1, want 2.18.0"}},
		{"newer is drift too", map[string]string{"BIOS": "2.16.0"}, []string{"BIOS: runs 2.17.1, want 2.16.0"}},
		{"versions exact, case too", map[string]string{"System ROM": "u46 v2.50 (03/01/2023)"}, []string{"System ROM: runs U46 v2.50 (03/01/2023), want u46 v2.50 (03/01/2023)"}},
		{"not reported", map[string]string{"GPU0": "96.00.5E.00.01"}, []string{"GPU0: not reported by the BMC (want 96.00.5E.00.01)"}},
		{"several, sorted", map[string]string{"zeta": "1", "BIOS": "3", "BMC": "6.10.30.00", "alpha": "2"},
			[]string{"BIOS: runs 2.17.1, want 3", "alpha: not reported by the BMC (want 2)", "zeta: not reported by the BMC (want 1)"}},
	}
	for _, c := range cases {
		if got := Drift(c.baseline, have); !slices.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
	if got := Drift(map[string]string{"BIOS": "1"}, nil); !slices.Equal(got, []string{"BIOS: not reported by the BMC (want 1)"}) {
		t.Errorf("nothing reported: %q", got)
	}
}
