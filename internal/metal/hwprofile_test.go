package metal

import (
	"strings"
	"testing"

	"bcd/internal/store"
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

// A console session's BMC: IPMI SOL at an IPMI node's BMC; at a Redfish node's host, port 623,
// with its credentials, only where its profile binds console=ipmi; never without an address.
func TestConsoleBMC(t *testing.T) {
	node := func(driver, addr string) store.Node {
		return store.Node{Name: "n1", BMCDriver: driver, BMCAddress: addr, BMCUsernameRef: "secret://u", BMCPasswordRef: "secret://p", BMCFingerprint: "ab", BMCInsecure: true}
	}
	cases := []struct {
		name    string
		n       store.Node
		drivers map[string]string
		addr    string
		err     string
	}{
		{"ipmi node", node("ipmi", "10.0.0.5:623"), nil, "10.0.0.5:623", ""},
		{"ipmi node, other port", node("ipmi", "10.0.0.5:6230"), map[string]string{"console": "ipmi"}, "10.0.0.5:6230", ""},
		{"redfish bound", node("redfish", "https://10.0.0.6:8443/redfish/v1/Systems/1"), map[string]string{"power": "redfish", "console": "ipmi"}, "10.0.0.6:623", ""},
		{"redfish IPv6 bound", node("redfish", "https://[fd00::6]"), map[string]string{"console": "ipmi"}, "[fd00::6]:623", ""},
		{"redfish unbound", node("redfish", "https://10.0.0.6"), map[string]string{"power": "redfish"}, "", "bind console=ipmi"},
		{"no address (in-band, not provisioned)", node("ipmi", ""), nil, "", "no BMC address yet"},
	}
	for _, c := range cases {
		ref, err := ConsoleBMC(c.n, c.drivers)
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want %q", c.name, err, c.err)
			}
		case err != nil:
			t.Errorf("%s: %v", c.name, err)
		case ref.Driver != "ipmi" || ref.Address != c.addr || ref.UsernameRef != "secret://u" || ref.PasswordRef != "secret://p" || ref.FingerprintSHA256 != "" && c.n.BMCDriver == "redfish":
			t.Errorf("%s: %+v, want ipmi at %s with the node's credentials", c.name, ref, c.addr)
		}
	}
	// console=ipmi beside power=redfish is one profile, not two BMC drivers.
	if err := oneBMCDriver(map[string]string{"power": "redfish", "console": "ipmi"}); err != nil {
		t.Errorf("console=ipmi with power=redfish: %v", err)
	}
}
