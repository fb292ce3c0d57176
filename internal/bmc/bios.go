package bmc

import (
	"context"
	"fmt"
	"maps"
	"slices"
)

// BIOS settings (DESIGN §5 "bios"): a pool names BIOS attributes and the values its machines
// must have (attribute → value, written as text: "Enabled", "42", "true"). The site agent writes
// the differing ones as pending settings, applied by the BMC at the machine's next reset, and
// after that reset reads them back: a BMC that took the write and did not apply it is caught.

// BIOSSetter is the bios concern: read the current value of named BIOS attributes, and write
// settings to apply at the next reset.
type BIOSSetter interface {
	// BIOSAttributes returns the current value of each named attribute as text (a JSON string
	// as it is, a number in decimal, a boolean as true or false). An attribute the BMC does not
	// report is absent from the map; a BMC that exposes no BIOS attributes at all is an error.
	// No names: every attribute the BMC reports (an operator's listing, bcd bmc bios get).
	BIOSAttributes(ctx context.Context, names []string) (map[string]string, error)
	// SetBIOSAttributes writes want as pending settings that the BMC applies at the next reset.
	// It writes only the attributes whose current value differs, and returns their names,
	// sorted (empty: nothing written). An attribute the BMC does not report, or a value that
	// cannot be given the attribute's type, is an error and nothing is written.
	SetBIOSAttributes(ctx context.Context, want map[string]string) (changed []string, err error)
}

// BIOSWriteResult is bmc.bios's result: the attributes written (sorted) and whether any were,
// hence settings pending until the next reset.
type BIOSWriteResult struct {
	Changed []string `json:"changed"`
	Pending bool     `json:"pending"`
}

// BIOSReadResult is bmc.query{query: bios}'s result: the named attributes' current values.
type BIOSReadResult struct {
	Attributes map[string]string `json:"attributes"`
}

// MaxBIOSSettings bounds the attributes of one pool's BIOS settings.
const MaxBIOSSettings = 128

// BIOSDrift compares a pool's BIOS settings (attribute → value) with what the BMC reported
// after the reset that applied them, and returns one line per attribute that differs or was not
// reported, sorted by attribute. Values compare exactly, as text. Pure.
func BIOSDrift(want, have map[string]string) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(want)) {
		v, ok := have[name]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: not reported by the BMC (want %s)", name, want[name]))
		case v != want[name]:
			out = append(out, fmt.Sprintf("%s: is %s, want %s", name, v, want[name]))
		}
	}
	return out
}
