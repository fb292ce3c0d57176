package bmc

import (
	"slices"
	"testing"
)

func TestBIOSDrift(t *testing.T) {
	cases := []struct {
		name       string
		want, have map[string]string
		drift      []string
	}{
		{"nothing wanted", nil, map[string]string{"A": "1"}, nil},
		{"all equal", map[string]string{"ProcVirtualization": "Enabled", "ProcCoreDisable": "0"}, map[string]string{"ProcVirtualization": "Enabled", "ProcCoreDisable": "0", "Other": "x"}, nil},
		{"one differs", map[string]string{"ProcVirtualization": "Enabled"}, map[string]string{"ProcVirtualization": "Disabled"},
			[]string{"ProcVirtualization: is Disabled, want Enabled"}},
		{"not reported", map[string]string{"SriovGlobalEnable": "Enabled"}, map[string]string{},
			[]string{"SriovGlobalEnable: not reported by the BMC (want Enabled)"}},
		{"case matters", map[string]string{"BootMode": "Uefi"}, map[string]string{"BootMode": "UEFI"}, []string{"BootMode: is UEFI, want Uefi"}},
		{"empty value wanted", map[string]string{"AssetTag": ""}, map[string]string{"AssetTag": "old"}, []string{"AssetTag: is old, want "}},
		{"sorted by attribute", map[string]string{"B": "1", "A": "1", "C": "1"}, map[string]string{"B": "2"},
			[]string{"A: not reported by the BMC (want 1)", "B: is 2, want 1", "C: not reported by the BMC (want 1)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := BIOSDrift(c.want, c.have); !slices.Equal(got, c.drift) {
				t.Errorf("drift %q, want %q", got, c.drift)
			}
		})
	}
}
