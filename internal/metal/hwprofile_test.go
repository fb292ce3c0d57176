package metal

import (
	"strings"
	"testing"
)

// A node has one BMC driver: a hardware profile binding management, inspect or virtual-media to
// another driver than power's would be stored and never used, so it is refused, saying what is
// accepted. Every pair of known drivers for each BMC concern is tried.
func TestOneBMCDriver(t *testing.T) {
	for _, power := range concernDrivers["power"] {
		for _, concern := range bmcConcerns {
			for _, d := range append([]string{""}, concernDrivers[concern]...) {
				err := oneBMCDriver(map[string]string{"power": power, concern: d, "boot": "ipxe", "deploy": "image-stream"})
				ok := d == "" || d == power || (concern == "inspect" && d == "ramdisk")
				switch {
				case ok && err != nil:
					t.Errorf("power=%s %s=%s: %v, want accepted", power, concern, d, err)
				case !ok && err == nil:
					t.Errorf("power=%s %s=%s accepted, want refused", power, concern, d)
				case !ok && !strings.Contains(err.Error(), "a node has one BMC driver"):
					t.Errorf("power=%s %s=%s: %q does not say why", power, concern, d, err)
				}
			}
		}
	}
	for _, c := range []struct {
		drivers map[string]string
		want    string
	}{
		{map[string]string{"power": "ipmi", "management": "redfish"}, "accepted for management: ipmi (or leave it out)"},
		{map[string]string{"power": "ipmi", "virtual-media": "redfish"}, "ipmi has no virtual-media driver: use power=redfish, or leave virtual-media out"},
		{map[string]string{"power": "redfish", "inspect": "ipmi"}, "accepted for inspect: redfish (or leave it out)"},
	} {
		if err := oneBMCDriver(c.drivers); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.drivers, err, c.want)
		}
	}
}
