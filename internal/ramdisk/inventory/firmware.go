package inventory

import (
	"path"
	"slices"
	"strings"
)

// FirmwareHint says that a device needs a non-free firmware package in the OS image (seed 003,
// phase 0.8: "bnx2 NIC → bnx2 firmware").
type FirmwareHint struct {
	Device  string `json:"device"`  // NIC name or PCI address
	Driver  string `json:"driver"`  // bound kernel driver ("" when matched by modalias)
	Package string `json:"package"` // Debian 12 (bookworm) package name
	Reason  string `json:"reason"`  // "driver bnx2" or "modalias pci:v000010EC*bc02*"
}

// firmwareRule maps a kernel driver to the Debian package holding its firmware. Package ""
// records that the driver is known to need no separate firmware package, so the table says so
// explicitly instead of by omission.
type firmwareRule struct {
	Driver  string
	Package string
}

// FirmwareDriverTable is the driver → Debian 12 (bookworm, non-free-firmware) package table.
func FirmwareDriverTable() []firmwareRule {
	return []firmwareRule{
		// Broadcom NetXtreme II and 10G
		{"bnx2", "firmware-bnx2"},
		{"cnic", "firmware-bnx2"},
		{"bnx2x", "firmware-bnx2x"},
		// Broadcom tg3 (tigon), Intel graphics and misc: firmware-misc-nonfree in bookworm
		{"tg3", "firmware-misc-nonfree"},
		{"i915", "firmware-misc-nonfree"},
		{"nouveau", "firmware-misc-nonfree"},
		// QLogic / Marvell
		{"qla2xxx", "firmware-qlogic"},
		{"qed", "firmware-qlogic"},
		{"qede", "firmware-qlogic"},
		{"netxen_nic", "firmware-netxen"},
		{"myri10ge", "firmware-myricom"},
		// AMD graphics
		{"amdgpu", "firmware-amd-graphics"},
		{"radeon", "firmware-amd-graphics"},
		// Wireless
		{"iwlwifi", "firmware-iwlwifi"},
		{"ath9k_htc", "firmware-atheros"},
		{"ath10k_pci", "firmware-atheros"},
		{"ath11k_pci", "firmware-atheros"},
		{"brcmfmac", "firmware-brcm80211"},
		// Realtek
		{"r8169", "firmware-realtek"},
		{"rtw88_pci", "firmware-realtek"},
		{"rtw89_pci", "firmware-realtek"},
		// Known to need nothing beyond the kernel (or load firmware from flash).
		{"mlx4_core", ""},
		{"mlx5_core", ""},
		{"e1000", ""},
		{"e1000e", ""},
		{"igb", ""},
		{"igc", ""},
		{"ixgbe", ""},
		{"i40e", ""},
		{"virtio_net", ""},
		{"virtio-pci", ""},
		{"virtio_blk", ""},
		{"nvme", ""},
		{"ahci", ""},
		{"megaraid_sas", ""},
		{"mpt3sas", ""},
		{"nvidia", ""}, // the proprietary driver carries its own GSP firmware
	}
}

type modaliasRule struct {
	Pattern string // path.Match glob over the PCI modalias
	Package string
}

// FirmwareModaliasTable matches devices with no bound driver (the ramdisk may lack the module):
// vendor + PCI base class, matched on the modalias "pci:vVVVVVVVVdDDDDDDDDsv…sd…bcCCscSSiII".
func FirmwareModaliasTable() []modaliasRule {
	return []modaliasRule{
		{"pci:v000010EC*bc02*", "firmware-realtek"},      // Realtek network controller
		{"pci:v00001002*bc03*", "firmware-amd-graphics"}, // AMD/ATI display controller
		{"pci:v00001077*bc0C*", "firmware-qlogic"},       // QLogic serial bus (fibre channel)
		{"pci:v00001077*bc02*", "firmware-qlogic"},       // QLogic network controller
	}
}

// FirmwarePackageForDriver looks a driver up; known=false means the table does not know it.
func FirmwarePackageForDriver(driver string) (pkg string, known bool) {
	// The kernel reports some drivers with dashes and their modules with underscores.
	norm := strings.ReplaceAll(driver, "-", "_")
	for _, r := range FirmwareDriverTable() {
		if strings.ReplaceAll(r.Driver, "-", "_") == norm {
			return r.Package, true
		}
	}
	return "", false
}

// FirmwarePackageForModalias matches a modalias against the table ("" when nothing matches).
func FirmwarePackageForModalias(modalias string) (pkg, pattern string) {
	for _, r := range FirmwareModaliasTable() {
		if ok, _ := path.Match(r.Pattern, modalias); ok {
			return r.Package, r.Pattern
		}
	}
	return "", ""
}

// FirmwareHints derives hints from the NICs and PCI devices: by bound driver first, by modalias
// for devices without a driver. The result is sorted and free of duplicates.
func FirmwareHints(inv Inventory) []FirmwareHint {
	var hints []FirmwareHint
	add := func(device, driver, modalias string) {
		if driver != "" {
			if pkg, known := FirmwarePackageForDriver(driver); known {
				if pkg != "" {
					hints = append(hints, FirmwareHint{Device: device, Driver: driver, Package: pkg, Reason: "driver " + driver})
				}
				return
			}
		}
		if pkg, pattern := FirmwarePackageForModalias(modalias); pkg != "" {
			hints = append(hints, FirmwareHint{Device: device, Driver: driver, Package: pkg, Reason: "modalias " + pattern})
		}
	}
	nicPCI := map[string]bool{}
	for _, n := range inv.NICs {
		add(n.Name, n.Driver, n.Modalias)
		if n.PCIAddress != "" {
			nicPCI[n.PCIAddress] = true
		}
	}
	for _, d := range inv.PCI {
		if nicPCI[d.Address] {
			continue // already hinted under the NIC's name
		}
		add(d.Address, d.Driver, d.Modalias)
	}
	slices.SortFunc(hints, func(a, b FirmwareHint) int {
		return strings.Compare(a.Package+"\x00"+a.Device, b.Package+"\x00"+b.Device)
	})
	return slices.Compact(hints)
}

// FirmwarePackages is the sorted, de-duplicated list of packages the hints name.
func FirmwarePackages(hints []FirmwareHint) []string {
	var pkgs []string
	for _, h := range hints {
		pkgs = append(pkgs, h.Package)
	}
	slices.Sort(pkgs)
	return slices.Compact(pkgs)
}
