package ipmi

import (
	"context"
	"fmt"
	"strings"

	"github.com/bougou/go-ipmi/pkg/types"

	"bcd/internal/bmc"
)

// selectorByDevice maps our boot devices to the IPMI boot device selector (Table 28-14 #5).
var selectorByDevice = map[bmc.BootDevice]types.BootDeviceSelector{
	bmc.BootPXE:  types.BootDeviceSelectorForcePXE,
	bmc.BootDisk: types.BootDeviceSelectorForceHardDrive,
	bmc.BootCD:   types.BootDeviceSelectorForceCDROM,
}

// planBootFlags builds parameter 5 for (dev, opts). IPMI has no "leave as is" bit, so with
// BootModeUnchanged the BIOS boot type is copied from current (the flags read before writing) when
// those flags are valid, i.e. an override someone set and the BIOS has not consumed yet. Flags that
// are not valid (a fresh BMC, a used one-time override) carry no intent: their boot type bit is
// whatever was left there (often 0, legacy), so EFI is written instead, the mode of the machines
// provisioned today. A legacy-BIOS machine needs BootModeLegacy.
func planBootFlags(dev bmc.BootDevice, opts bmc.BootOptions, current types.BootOptionParam_BootFlags) (types.BootOptionParam_BootFlags, error) {
	sel, ok := selectorByDevice[dev]
	if !ok {
		_, err := bmc.ParseBootDevice(string(dev))
		return types.BootOptionParam_BootFlags{}, err
	}
	f := types.BootOptionParam_BootFlags{BootFlagsValid: true, Persist: opts.Persistent, BootDeviceSelector: sel}
	switch opts.Mode {
	case bmc.BootModeUEFI:
		f.BIOSBootType = types.BIOSBootTypeEFI
	case bmc.BootModeLegacy:
		f.BIOSBootType = types.BIOSBootTypeLegacy
	case bmc.BootModeUnchanged:
		f.BIOSBootType = types.BIOSBootTypeEFI
		if current.BootFlagsValid {
			f.BIOSBootType = current.BIOSBootType
		}
	default:
		return types.BootOptionParam_BootFlags{}, fmt.Errorf("unknown boot mode %q: accepted are uefi, legacy or empty", opts.Mode)
	}
	return f, nil
}

// describeBootFlags names what flags ask for, in our words.
func describeBootFlags(f types.BootOptionParam_BootFlags) string {
	if !f.BootFlagsValid {
		return "no override (boot flags not valid)"
	}
	dev := fmt.Sprintf("selector %#x", uint8(f.BootDeviceSelector))
	for d, s := range selectorByDevice {
		if s == f.BootDeviceSelector {
			dev = string(d)
		}
	}
	if f.BootDeviceSelector == types.BootDeviceSelectorNoOverride {
		dev = "no override"
	}
	persist := "next boot only"
	if f.Persist {
		persist = "persistent"
	}
	mode := "legacy"
	if f.BIOSBootType == types.BIOSBootTypeEFI {
		mode = "uefi"
	}
	return fmt.Sprintf("%s, %s, %s", dev, persist, mode)
}

// bootMismatch lists the fields of got that differ from want ("" when the BMC applied it).
func bootMismatch(want, got types.BootOptionParam_BootFlags) string {
	var diffs []string
	if got.BootFlagsValid != want.BootFlagsValid {
		diffs = append(diffs, "valid bit")
	}
	if got.BootDeviceSelector != want.BootDeviceSelector {
		diffs = append(diffs, "device")
	}
	if got.Persist != want.Persist {
		diffs = append(diffs, "persistence")
	}
	if got.BIOSBootType != want.BIOSBootType {
		diffs = append(diffs, "boot mode")
	}
	return strings.Join(diffs, ", ")
}

// SetBootDevice writes boot parameter 5 and reads it back: a BMC that accepted the write but
// did not apply it is an error (LAB-NOTES gotcha 5).
func (d *Driver) SetBootDevice(ctx context.Context, dev bmc.BootDevice, opts bmc.BootOptions) error {
	if _, err := bmc.ParseBootDevice(string(dev)); err != nil {
		return fmt.Errorf("setting boot device on %s: %w", d.addr, err)
	}
	if _, err := planBootFlags(dev, opts, types.BootOptionParam_BootFlags{}); err != nil {
		return fmt.Errorf("setting boot device on %s: %w", d.addr, err)
	}
	return d.withSession(ctx, fmt.Sprintf("setting boot device %s", dev), func(ctx context.Context, s *session) error {
		var current types.BootOptionParam_BootFlags
		if opts.Mode == bmc.BootModeUnchanged {
			if err := s.readBootFlags(ctx, &current); err != nil {
				return err
			}
			if !current.BootFlagsValid {
				d.log.Info("boot mode not given and the BMC holds no valid override to keep it from; writing UEFI (give mode legacy for a legacy-BIOS machine)")
			}
		}
		want, err := planBootFlags(dev, opts, current)
		if err != nil {
			return err
		}
		// Parameter 3: ask the BMC not to clear the valid bit on its 60 s timeout, so the override
		// survives a slow power-on. Best effort: not every BMC implements it.
		err = s.do(ctx, "Set System Boot Options (valid bit clearing)", func(ctx context.Context) error {
			return s.c.SetSystemBootOptionsParamFor(ctx, &types.BootOptionParam_BMCBootFlagValidBitClear{DontClearOnCommandReceivedTimeout: true})
		})
		if err != nil {
			d.log.Debug("BMC refused boot parameter 3; continuing", "err", err)
		}
		err = s.do(ctx, "Set System Boot Options (boot flags)", func(ctx context.Context) error {
			return s.c.SetSystemBootOptionsParamFor(ctx, &want)
		})
		if err != nil {
			return err
		}
		var got types.BootOptionParam_BootFlags
		if err := s.readBootFlags(ctx, &got); err != nil {
			return fmt.Errorf("reading back boot flags: %w", err)
		}
		if diff := bootMismatch(want, got); diff != "" {
			return fmt.Errorf("the BMC accepted boot flags (%s) but reads back (%s): %s not applied; this BMC ignores boot overrides written over IPMI",
				describeBootFlags(want), describeBootFlags(got), diff)
		}
		d.log.Info("boot device set and read back", "flags", describeBootFlags(got))
		return nil
	})
}

func (s *session) readBootFlags(ctx context.Context, f *types.BootOptionParam_BootFlags) error {
	return s.do(ctx, "Get System Boot Options (boot flags)", func(ctx context.Context) error {
		return s.c.GetSystemBootOptionsParamFor(ctx, f)
	})
}
