package ipmi

import (
	"context"
	"fmt"

	"bcd/internal/bmc"
)

// formatSMBIOSGUID renders a Get System GUID answer as a canonical lower-case UUID. IPMI keeps the
// system GUID in SMBIOS byte order (DSP0134 7.2.1: time_low, time_mid and time_hi little-endian,
// the rest as is), so the result equals dmidecode's system UUID inside the machine. All zeros
// and all FFh mean "no GUID" (ok false).
func formatSMBIOSGUID(b [16]byte) (string, bool) {
	zero, ff := true, true
	for _, c := range b {
		zero = zero && c == 0
		ff = ff && c == 0xff
	}
	if zero || ff {
		return "", false
	}
	return fmt.Sprintf("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		b[3], b[2], b[1], b[0], b[5], b[4], b[7], b[6],
		b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]), true
}

// Inspect reads the system GUID (as SystemUUID) and the power state.
func (d *Driver) Inspect(ctx context.Context) (bmc.OOBInventory, error) {
	var inv bmc.OOBInventory
	err := d.withSession(ctx, "inspecting", func(ctx context.Context, s *session) error {
		var raw [16]byte
		err := s.do(ctx, "Get System GUID", func(ctx context.Context) error {
			r, err := s.c.GetSystemGUID(ctx)
			if err != nil {
				return err
			}
			raw = r.GUID
			return nil
		})
		if err != nil {
			return err
		}
		if u, ok := formatSMBIOSGUID(raw); ok {
			inv.SystemUUID = u
		} else {
			d.log.Warn("BMC reports no system GUID")
		}
		on, err := s.poweredOn(ctx)
		if err != nil {
			return err
		}
		inv.Power = stateOf(on)
		return nil
	})
	if err != nil {
		return bmc.OOBInventory{}, err
	}
	return inv, nil
}

// Firmware reads the BMC's firmware revision (Get Device ID) as component "BMC": IPMI tells
// nothing of the other firmware of the machine. The revision reads as ipmitool prints it:
// major.minor, the minor two BCD digits ("2.05").
func (d *Driver) Firmware(ctx context.Context) ([]bmc.Firmware, error) {
	var out []bmc.Firmware
	err := d.withSession(ctx, "reading the firmware revision", func(ctx context.Context, s *session) error {
		return s.do(ctx, "Get Device ID", func(ctx context.Context) error {
			r, err := s.c.GetDeviceID(ctx)
			if err != nil {
				return err
			}
			out = []bmc.Firmware{{ID: "BMC", Name: "BMC", Version: FirmwareRevision(r.MajorFirmwareRevision, r.MinorFirmwareRevision)}}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// FirmwareRevision renders Get Device ID's firmware revision: major in binary (7 bits), minor in
// BCD. Pure.
func FirmwareRevision(major, minorBCD uint8) string {
	return fmt.Sprintf("%d.%02x", major&0x7f, minorBCD)
}
