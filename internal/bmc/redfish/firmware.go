package redfish

import (
	"context"
	"fmt"
	"strings"

	"bcd/internal/bmc"
)

// firmwareDoc is a SoftwareInventory member of the UpdateService's FirmwareInventory.
type firmwareDoc struct {
	ID      string `json:"Id"`
	Name    string `json:"Name"`
	Version string `json:"Version"`
}

// Firmware reads the firmware versions the BMC reports: every member of the UpdateService's
// FirmwareInventory that has a version (its Id, Name and Version as the BMC gives them), then
// the system's BiosVersion as "BIOS" and its first manager's FirmwareVersion as "BMC" where the
// inventory has no component of that id or name (BMCs without an UpdateService, or with ids
// such as Dell's "Installed-…__BIOS.Setup.1-1" next to the name "BIOS", found by name).
func (c *Client) Firmware(ctx context.Context) ([]bmc.Firmware, error) {
	var out []bmc.Firmware
	err := c.retry(ctx, "reading firmware versions", func(ctx context.Context) error {
		out = out[:0]
		var root struct {
			UpdateService odataRef `json:"UpdateService"`
		}
		if _, err := c.getJSON(ctx, "/redfish/v1", &root); err != nil {
			return err
		}
		if root.UpdateService.ID != "" {
			var us struct {
				FirmwareInventory odataRef `json:"FirmwareInventory"`
			}
			if _, err := c.getJSON(ctx, root.UpdateService.ID, &us); err != nil {
				return err
			}
			if us.FirmwareInventory.ID != "" {
				ids, err := c.members(ctx, us.FirmwareInventory.ID)
				if err != nil {
					return err
				}
				if len(ids) > bmc.MaxFirmwareComponents {
					return fmt.Errorf("firmware inventory %s lists %d components: at most %d are read", us.FirmwareInventory.ID, len(ids), bmc.MaxFirmwareComponents)
				}
				for _, id := range ids {
					var f firmwareDoc
					if _, err := c.getJSON(ctx, id, &f); err != nil {
						return err
					}
					if v := strings.TrimSpace(f.Version); v != "" {
						out = append(out, bmc.Firmware{ID: f.ID, Name: f.Name, Version: v})
					}
				}
			}
		}
		sys, _, err := c.getSystem(ctx)
		if err != nil {
			return err
		}
		if v := strings.TrimSpace(sys.BiosVersion); v != "" {
			if _, ok := bmc.FindFirmware(out, "BIOS"); !ok {
				out = append(out, bmc.Firmware{ID: "BIOS", Name: "BIOS", Version: v})
			}
		}
		if _, ok := bmc.FindFirmware(out, "BMC"); !ok && len(sys.Links.ManagedBy) > 0 {
			var mgr struct {
				FirmwareVersion string `json:"FirmwareVersion"`
			}
			if _, err := c.getJSON(ctx, sys.Links.ManagedBy[0].ID, &mgr); err != nil {
				return err
			}
			if v := strings.TrimSpace(mgr.FirmwareVersion); v != "" {
				out = append(out, bmc.Firmware{ID: "BMC", Name: "BMC", Version: v})
			}
		}
		return nil
	})
	if out == nil {
		out = []bmc.Firmware{}
	}
	return out, err
}
