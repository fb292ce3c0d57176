package image

import (
	"testing"

	"bcd/internal/ramdisk/inventory"
)

func TestSelectDisk(t *testing.T) {
	const g = 1 << 30
	nvmeA := inventory.Disk{Name: "nvme0n1", Serial: "NA", WWN: "eui.a", ByPath: "pci-0000:3b:00.0-nvme-1", Model: "Samsung 970", SizeBytes: 1000 * g, Transport: inventory.TransportNVMe}
	nvmeB := inventory.Disk{Name: "nvme1n1", Serial: "NB", WWN: "eui.b", ByPath: "pci-0000:3c:00.0-nvme-1", Model: "Samsung 970", SizeBytes: 1000 * g, Transport: inventory.TransportNVMe}
	ssd := inventory.Disk{Name: "sda", Serial: "SA", WWN: "naa.1", ByPath: "pci-0000:00:17.0-ata-1", Model: "INTEL SSD", SizeBytes: 240 * g, Transport: inventory.TransportSATA}
	hdd := inventory.Disk{Name: "sdb", Serial: "SB", ByPath: "pci-0000:00:17.0-ata-2", Model: "ST4000", SizeBytes: 4000 * g, Rotational: true, Transport: inventory.TransportSATA}
	usb := inventory.Disk{Name: "sdc", Serial: "U", ByPath: "pci-0000:00:14.0", SizeBytes: 32 * g, Removable: true, Transport: inventory.TransportUSB}
	usbFixed := inventory.Disk{Name: "sdd", Serial: "UF", SizeBytes: 16 * g, Transport: inventory.TransportUSB}
	tiny := inventory.Disk{Name: "sde", Serial: "T", SizeBytes: 1 * g, Transport: inventory.TransportSATA}
	ro := inventory.Disk{Name: "sdf", Serial: "RO", SizeBytes: 100 * g, ReadOnly: true, Transport: inventory.TransportSATA}
	all := []inventory.Disk{hdd, nvmeB, usb, ssd, nvmeA, usbFixed, tiny, ro}

	tests := []struct {
		name  string
		disks []inventory.Disk
		hints Hints
		want  string // disk name, "" for an error
	}{
		{"no hints: smallest solid-state", all, Hints{}, "sda"},
		{"no hints: equal nvme pair, lowest by-path", []inventory.Disk{nvmeB, nvmeA, hdd}, Hints{}, "nvme0n1"},
		{"no hints: rotational only", []inventory.Disk{hdd, usb}, Hints{}, "sdb"},
		{"no hints: only removable/usb/tiny/ro", []inventory.Disk{usb, usbFixed, tiny, ro}, Hints{}, ""},
		{"no disks", nil, Hints{}, ""},
		{"serial", all, Hints{Serial: "NB"}, "nvme1n1"},
		{"wwn case-insensitive", all, Hints{WWN: "EUI.A"}, "nvme0n1"},
		{"by-path with prefix", all, Hints{ByPath: "/dev/disk/by-path/pci-0000:00:17.0-ata-2"}, "sdb"},
		{"by-path bare", all, Hints{ByPath: "pci-0000:3c:00.0-nvme-1"}, "nvme1n1"},
		{"name", all, Hints{Name: "sda"}, "sda"},
		{"model ambiguous", all, Hints{Model: "samsung"}, ""},
		{"model + min size", all, Hints{Model: "st4000", MinSize: 1000 * g}, "sdb"},
		{"min size ambiguous", all, Hints{MinSize: 500 * g}, ""},
		{"min size unique", all, Hints{MinSize: 2000 * g}, "sdb"},
		{"serial and wrong wwn", all, Hints{Serial: "NA", WWN: "eui.b"}, ""},
		{"serial too small", all, Hints{Serial: "SA", MinSize: 500 * g}, ""},
		{"removable only when named", all, Hints{Serial: "U"}, "sdc"},
		{"removable not by model", []inventory.Disk{usb}, Hints{MinSize: g}, ""},
		{"read-only never", all, Hints{Serial: "RO"}, ""},
		{"unknown serial", all, Hints{Serial: "nope"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SelectDisk(tt.disks, tt.hints)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("got %s, want an error", got.Name)
				}
				return
			}
			if err != nil || got.Name != tt.want {
				t.Fatalf("got %q (%v), want %q", got.Name, err, tt.want)
			}
		})
	}
	// The input order never matters and the input is not modified.
	rev := []inventory.Disk{ro, tiny, usbFixed, nvmeA, ssd, usb, nvmeB, hdd}
	if d, _ := SelectDisk(rev, Hints{}); d.Name != "sda" || rev[0].Name != "sdf" {
		t.Error("selection depends on order or mutated the input")
	}
}
