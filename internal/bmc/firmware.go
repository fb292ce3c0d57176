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

// FirmwareUpdater installs firmware through the BMC (the firmware.update step): the BMC fetches
// the image at imageURL (the site agent's cache, over HTTP) and installs it on the named
// components (firmware inventory ids, as Firmware reports them), and the call returns once the
// BMC reports the update done. A component's new version may run only after the machine's next
// reset (a BIOS), or at once (the BMC's own).
type FirmwareUpdater interface {
	// UpdateFirmware has the BMC install the image at imageURL on components, waiting for the
	// BMC's update task to end (ctx bounds the wait). progress, when not nil, is told the task's
	// percentage as the BMC reports it. A task that ends in anything but success is an error
	// carrying the BMC's messages.
	UpdateFirmware(ctx context.Context, imageURL string, components []string, progress func(percent int)) error
}

// FirmwareImage is one update of bmc.firmware: the component (as the baseline names it), the
// version the baseline wants, and the catalog image that brings it (name, URL, size, SHA-256:
// the site agent caches it, verified, and serves it to the BMC).
type FirmwareImage struct {
	Component string `json:"component"`
	Version   string `json:"version"`
	Image     string `json:"image"`
	URL       string `json:"url"`
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256"`
}

// FirmwareUpdateResult is bmc.firmware's result: the components updated (sorted), and whether
// any were, hence versions pending until the next reset.
type FirmwareUpdateResult struct {
	Updated []string `json:"updated"`
	Pending bool     `json:"pending"`
}
