package inventory

import (
	"os"
	"path/filepath"
	"testing"
)

func TestIsEMMCRPMB(t *testing.T) {
	for name, want := range map[string]bool{
		"mmcblk0rpmb": true, "mmcblk12rpmb": true,
		"mmcblk0": false, "mmcblk0boot0": false, "mmcblk0p1": false, "mmcblkrpmb": false, "sda": false, "mmcblk0rpmbx": false,
	} {
		if got := isEMMCRPMB(name); got != want {
			t.Errorf("isEMMCRPMB(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestRPMBIsNotADisk: an eMMC's replay-protected memory block, which older kernels list in
// /sys/block, is skipped with its reason (it stores nothing a wipe could erase: a wipe that
// tried would fail every eMMC machine), even when virtual disks are asked for.
func TestRPMBIsNotADisk(t *testing.T) {
	sys := t.TempDir()
	if err := os.MkdirAll(filepath.Join(sys, "block", "mmcblk0rpmb"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, opts := range []Options{{}, {IncludeVirtualDisks: true}} {
		disks, skipped, err := readDisks(Roots{Sys: sys, Dev: t.TempDir()}, opts)
		if err != nil {
			t.Fatalf("%+v: %v", opts, err)
		}
		if len(disks) != 0 || len(skipped) != 1 || skipped[0].Name != "mmcblk0rpmb" || skipped[0].Reason == "" {
			t.Fatalf("%+v: disks %+v, skipped %+v; want only mmcblk0rpmb skipped with a reason", opts, disks, skipped)
		}
	}
}
