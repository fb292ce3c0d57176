package wipe

import (
	"context"
	"strings"
	"testing"

	"bcd/internal/ramdisk/looptest"
)

// TestHiddenCapacityBlockDevice: a real block device that is neither ATA nor NVMe (a loop
// device) says it was not checked and why, and a wipe of it records that and passes; a regular
// file says the check does not apply.
func TestHiddenCapacityBlockDevice(t *testing.T) {
	looptest.RequireRoot(t)
	const size = 4 * mib
	for _, tc := range []struct {
		name   string
		path   func() string
		detail string
	}{
		{"loop device", func() string { return looptest.Attach(t, randomFile(t, size), false) }, "not checked: not an ATA or NVMe disk"},
		{"regular file", func() string { return randomFile(t, size) }, "not applicable: a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, err := Open(tc.path(), OpenOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			res, err := Wipe(context.Background(), testLog(), Identity{Name: tc.name}, dev, Request{Mode: ModeQuick}, nil)
			if err != nil || !res.Passed() {
				t.Fatalf("err %v result %+v", err, res)
			}
			if h := res.HiddenCapacity; h.Checked || h.Found || !strings.Contains(h.Detail, tc.detail) {
				t.Errorf("hidden capacity %+v, want unchecked %q", h, tc.detail)
			}
		})
	}
}
