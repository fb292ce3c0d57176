package bmc

import (
	"strings"
	"testing"
)

// TestCommandBootMode: an explicit step argument wins over the node's boot mode; a node without
// one leaves the driver's behaviour (no mode).
func TestCommandBootMode(t *testing.T) {
	tests := []struct {
		name     string
		stepMode string
		node     BootMode
		want     BootMode
	}{
		{"neither", "", BootModeUnchanged, BootModeUnchanged},
		{"node legacy, step silent", "", BootModeLegacy, BootModeLegacy},
		{"node uefi, step silent", "", BootModeUEFI, BootModeUEFI},
		{"step legacy, node silent", "legacy", BootModeUnchanged, BootModeLegacy},
		{"step uefi wins over node legacy", "uefi", BootModeLegacy, BootModeUEFI},
		{"step legacy wins over node uefi", "legacy", BootModeUEFI, BootModeLegacy},
		{"step and node agree", "legacy", BootModeLegacy, BootModeLegacy},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CommandBootMode(tt.stepMode, tt.node); got != tt.want {
				t.Errorf("CommandBootMode(%q, %q) = %q, want %q", tt.stepMode, tt.node, got, tt.want)
			}
		})
	}
}

func TestParseBootMode(t *testing.T) {
	tests := []struct {
		in      string
		want    BootMode
		wantErr bool
	}{
		{"", BootModeUnchanged, false},
		{"uefi", BootModeUEFI, false},
		{"legacy", BootModeLegacy, false},
		{"UEFI", "", true},
		{"bios", "", true},
		{"unchanged", "", true},
	}
	for _, tt := range tests {
		got, err := ParseBootMode(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseBootMode(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), "accepted are uefi, legacy") {
			t.Errorf("ParseBootMode(%q): error %q does not say what is accepted", tt.in, err)
		}
	}
}
