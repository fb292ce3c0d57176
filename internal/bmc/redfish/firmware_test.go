package redfish_test

import (
	"slices"
	"testing"

	"bcd/internal/bmc"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
)

// Firmware reads the UpdateService's FirmwareInventory, and adds the system's BiosVersion as
// BIOS and the manager's FirmwareVersion as BMC only where the inventory has neither (by id or
// name); a BMC without an UpdateService gives those two alone.
func TestFirmware(t *testing.T) {
	dell := []redfishbmc.FirmwareComponent{
		{ID: "Installed-159-2.17.1__BIOS.Setup.1-1", Name: "BIOS", Version: "2.17.1"},
		{ID: "Installed-25227-6.10.30.20__iDRAC.Embedded.1-1", Name: "Integrated Dell Remote Access Controller", Version: "6.10.30.20"},
		{ID: "NIC.Slot.1-1-1", Name: "Mellanox ConnectX-6", Version: "22.36.1010"},
		{ID: "Previous-159-2.16.0__BIOS.Setup.1-1", Name: "BIOS", Version: ""}, // no version: left out
	}
	cases := []struct {
		name   string
		mod    func(*redfishbmc.Config)
		want   []bmc.Firmware
		absent []string // components the baseline would not find
	}{
		{"inventory with a BIOS entry", func(c *redfishbmc.Config) { c.Firmware, c.BiosVersion = dell, "2.17.1" }, []bmc.Firmware{
			{ID: "Installed-159-2.17.1__BIOS.Setup.1-1", Name: "BIOS", Version: "2.17.1"},
			{ID: "Installed-25227-6.10.30.20__iDRAC.Embedded.1-1", Name: "Integrated Dell Remote Access Controller", Version: "6.10.30.20"},
			{ID: "NIC.Slot.1-1-1", Name: "Mellanox ConnectX-6", Version: "22.36.1010"},
			{ID: "BMC", Name: "BMC", Version: "bcd-vbmc-1"},
		}, nil},
		{"empty inventory", func(c *redfishbmc.Config) { c.BiosVersion = "1.16.3-debian" }, []bmc.Firmware{
			{ID: "BIOS", Name: "BIOS", Version: "1.16.3-debian"}, {ID: "BMC", Name: "BMC", Version: "bcd-vbmc-1"},
		}, []string{"NIC.Slot.1-1-1"}},
		{"no UpdateService", func(c *redfishbmc.Config) {
			c.Firmware, c.BiosVersion, c.Quirks.NoUpdateService = dell, "2.17.1", true
		}, []bmc.Firmware{{ID: "BIOS", Name: "BIOS", Version: "2.17.1"}, {ID: "BMC", Name: "BMC", Version: "bcd-vbmc-1"}}, []string{"NIC.Slot.1-1-1"}},
		{"no BIOS version anywhere", nil, []bmc.Firmware{{ID: "BMC", Name: "BMC", Version: "bcd-vbmc-1"}}, []string{"BIOS"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, c.mod, nil)
			got, err := r.c.Firmware(ctx(t))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("Firmware = %+v, want %+v", got, c.want)
			}
			for _, comp := range c.absent {
				if f, ok := bmc.FindFirmware(got, comp); ok {
					t.Errorf("%s found as %+v, want absent", comp, f)
				}
			}
		})
	}
}
