package image

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"bcd/internal/ramdisk/inventory"
)

// Hints identify the root disk. Serial, WWN, ByPath and Name identify one disk; Model and MinSize
// narrow the candidates. Every given hint must match.
type Hints struct {
	Serial  string `json:"serial"`
	WWN     string `json:"wwn"`
	ByPath  string `json:"byPath"` // with or without /dev/disk/by-path/
	Name    string `json:"name"`   // kernel name: unstable across boots, accepted as a last resort
	Model   string `json:"model"`  // substring, case-insensitive
	MinSize uint64 `json:"minSize"`
}

// DefaultMinSize is the smallest disk chosen without hints.
const DefaultMinSize = 4 << 30

func (h Hints) identifying() bool {
	return h.Serial != "" || h.WWN != "" || h.ByPath != "" || h.Name != ""
}

func (h Hints) matches(d inventory.Disk) bool {
	eq := func(hint, v string) bool { return hint == "" || strings.EqualFold(hint, v) }
	byPath := strings.TrimPrefix(h.ByPath, "/dev/disk/by-path/")
	return eq(h.Serial, d.Serial) && eq(h.WWN, d.WWN) && eq(byPath, d.ByPath) && eq(h.Name, d.Name) &&
		(h.Model == "" || strings.Contains(strings.ToLower(d.Model), strings.ToLower(h.Model))) &&
		d.SizeBytes >= h.MinSize
}

// SelectDisk chooses the disk to write the image to. It never assumes a device name.
//
//   - Read-only disks are never chosen.
//   - With hints: the disks matching every hint; removable disks qualify only when an identifying
//     hint (serial, WWN, by-path, name) names them. Exactly one must match: none or two is an error.
//   - Without hints: among non-removable, non-USB disks of at least DefaultMinSize, prefer solid
//     state over rotational, then the smallest (the Ironic convention: big disks stay for data),
//     then the lowest by-path (stable across boots), then the name.
func SelectDisk(disks []inventory.Disk, h Hints) (inventory.Disk, error) {
	writable := slices.DeleteFunc(slices.Clone(disks), func(d inventory.Disk) bool { return d.ReadOnly })
	if h != (Hints{}) {
		var m []inventory.Disk
		for _, d := range writable {
			if d.Removable && !h.identifying() {
				continue
			}
			if h.matches(d) {
				m = append(m, d)
			}
		}
		switch len(m) {
		case 0:
			return inventory.Disk{}, fmt.Errorf("no writable disk matches the root device hints %+v", h)
		case 1:
			return m[0], nil
		}
		names := make([]string, len(m))
		for i, d := range m {
			names[i] = d.Name
		}
		return inventory.Disk{}, fmt.Errorf("root device hints %+v are ambiguous: %s match", h, strings.Join(names, ", "))
	}
	c := slices.DeleteFunc(writable, func(d inventory.Disk) bool {
		return d.Removable || d.Transport == inventory.TransportUSB || d.SizeBytes < DefaultMinSize
	})
	if len(c) == 0 {
		return inventory.Disk{}, errors.New("no fixed writable disk of at least 4 GiB for the image")
	}
	slices.SortFunc(c, func(a, b inventory.Disk) int {
		return cmp.Or(
			cmpBool(a.Rotational, b.Rotational),
			cmp.Compare(a.SizeBytes, b.SizeBytes),
			cmp.Compare(a.ByPath, b.ByPath),
			cmp.Compare(a.Name, b.Name),
		)
	})
	return c[0], nil
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	}
	return 1
}
