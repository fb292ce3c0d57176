package engine

import "testing"

func TestFastTrackable(t *testing.T) {
	tests := []struct {
		name                  string
		power                 string
		connectedAt, lastBoot int64
		want                  bool
	}{
		{"ramdisk joined after the last power cycle", "on", 200, 100, true},
		{"ramdisk joined and the node never power-cycled by us", "on", 200, 0, true},
		{"connection older than the last power cycle (a reset machine sends no FIN)", "on", 100, 200, false},
		{"joined in the same microsecond as the boot command", "on", 100, 100, false},
		{"no ramdisk connected", "on", 0, 0, false},
		{"powered off since", "off", 200, 100, false},
		{"power unknown", "unknown", 200, 100, false},
	}
	for _, tc := range tests {
		if got := FastTrackable(tc.power, tc.connectedAt, tc.lastBoot); got != tc.want {
			t.Errorf("%s: FastTrackable(%q, %d, %d) = %v, want %v", tc.name, tc.power, tc.connectedAt, tc.lastBoot, got, tc.want)
		}
	}
}
