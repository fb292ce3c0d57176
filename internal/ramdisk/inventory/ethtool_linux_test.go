package inventory

import (
	"context"
	"os"
	"testing"
)

// Smoke test of the ethtool ioctl on this machine's NICs: it answers or gives "", never fails
// the inventory.
func TestEthtoolFirmwareRealSystem(t *testing.T) {
	if _, err := os.Stat("/sys/class/net"); err != nil {
		t.Skip("no /sys/class/net here")
	}
	inv, err := Collect(context.Background(), Roots{}, Options{NICFirmware: EthtoolFirmware})
	if err != nil {
		t.Fatalf("Collect with ethtool: %v", err)
	}
	for _, n := range inv.NICs {
		t.Logf("nic %s driver %s firmware %q", n.Name, n.Driver, n.Firmware)
	}
	if got := EthtoolFirmware("no-such-nic0"); got != "" {
		t.Errorf("firmware of a NIC that does not exist: %q, want none", got)
	}
}
