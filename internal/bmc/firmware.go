package bmc

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Firmware is one firmware component as a BMC reports it: its inventory id and name (Redfish's
// FirmwareInventory member Id and Name; "BIOS" and "BMC" where the driver derives them) and the
// version it runs.
type Firmware struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Version string `json:"version"`
}

// FirmwareReader reads the machine's firmware versions (the firmware.check step).
type FirmwareReader interface {
	Firmware(ctx context.Context) ([]Firmware, error)
}

// MaxFirmwareComponents bounds the components one reading keeps: a BMC listing more is refused
// rather than read for minutes.
const MaxFirmwareComponents = 256

// FindFirmware returns the component a baseline names: the first whose id, else whose name,
// equals it, ignoring case (a pool's baseline says "BIOS" where one vendor's id is "bios").
func FindFirmware(have []Firmware, component string) (Firmware, bool) {
	for _, f := range have {
		if strings.EqualFold(f.ID, component) {
			return f, true
		}
	}
	for _, f := range have {
		if strings.EqualFold(f.Name, component) {
			return f, true
		}
	}
	return Firmware{}, false
}

// Drift compares a pool's firmware baseline (component → the version it must run) with what the
// BMC reported, and returns one line per component that differs or was not reported, sorted by
// component. Versions compare exactly: a baseline names the version an operator qualified, and
// "newer" is not "qualified". Pure.
func Drift(baseline map[string]string, have []Firmware) []string {
	var out []string
	for _, comp := range slices.Sorted(maps.Keys(baseline)) {
		want := baseline[comp]
		f, ok := FindFirmware(have, comp)
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: not reported by the BMC (want %s)", comp, want))
		case f.Version != want:
			out = append(out, fmt.Sprintf("%s: runs %s, want %s", comp, f.Version, want))
		}
	}
	return out
}
