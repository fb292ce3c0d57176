// Package inventory collects what the ramdisk reports about a machine: CPU, memory, disks, NICs,
// PCI devices (GPUs flagged), DMI identity, boot mode and firmware hints. Everything is read from
// sysfs and procfs under configurable roots so tests run against committed fixture trees; the
// result is plain data with stable JSON field names.
//
// Nothing is dropped silently: block devices and network interfaces that are not reported (loop,
// ram, zram, device-mapper, virtual NICs, ...) are listed in Inventory.Skipped with the reason.
package inventory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Roots are the filesystem roots Collect reads. Zero fields mean the real ones.
type Roots struct {
	Sys  string // default /sys
	Proc string // default /proc
	Dev  string // default /dev
}

func (r Roots) withDefaults() Roots {
	r.Sys = cmp.Or(r.Sys, "/sys")
	r.Proc = cmp.Or(r.Proc, "/proc")
	r.Dev = cmp.Or(r.Dev, "/dev")
	return r
}

// Options choose what Collect includes beyond the defaults.
type Options struct {
	// IncludeVirtualDisks reports loop, ram, zram, dm, md and nbd devices instead of skipping them.
	IncludeVirtualDisks bool
	// NICFirmware reads a NIC's firmware version by interface name ("" when it has none or it
	// cannot be read): sysfs does not export it (the ramdisk passes EthtoolFirmware). Nil: none
	// is read.
	NICFirmware func(name string) string
}

// Inventory is the machine as the ramdisk sees it.
type Inventory struct {
	CPU           CPU            `json:"cpu"`
	Memory        Memory         `json:"memory"`
	Disks         []Disk         `json:"disks"`
	NICs          []NIC          `json:"nics"`
	PCI           []PCIDevice    `json:"pci"`
	DMI           DMI            `json:"dmi"`
	BootMode      BootMode       `json:"bootMode"`
	FirmwareHints []FirmwareHint `json:"firmwareHints"`
	Skipped       []Skipped      `json:"skipped"`
}

// BootMode is how the firmware started the ramdisk.
type BootMode string

// Boot modes.
const (
	BootUEFI BootMode = "uefi"
	BootBIOS BootMode = "bios"
)

// CPU summarises the processors.
type CPU struct {
	Model   string   `json:"model"`
	Sockets int      `json:"sockets"`
	Cores   int      `json:"cores"`
	Threads int      `json:"threads"`
	Flags   []string `json:"flags"` // the subset of interestingCPUFlags present, sorted
}

// Memory is the usable RAM.
type Memory struct {
	TotalBytes uint64 `json:"totalBytes"`
}

// Transport is how a disk is attached.
type Transport string

// Transports.
const (
	TransportNVMe    Transport = "nvme"
	TransportSATA    Transport = "sata"
	TransportSAS     Transport = "sas"
	TransportSCSI    Transport = "scsi"
	TransportVirtio  Transport = "virtio"
	TransportUSB     Transport = "usb"
	TransportMMC     Transport = "mmc"
	TransportUnknown Transport = "unknown"
)

// Disk is one whole block device.
type Disk struct {
	Name              string    `json:"name"` // kernel name, e.g. nvme0n1
	Path              string    `json:"path"` // device node under Roots.Dev
	Model             string    `json:"model"`
	Serial            string    `json:"serial"`
	WWN               string    `json:"wwn"`
	SizeBytes         uint64    `json:"sizeBytes"`
	LogicalBlockSize  uint32    `json:"logicalBlockSize"`
	PhysicalBlockSize uint32    `json:"physicalBlockSize"`
	Rotational        bool      `json:"rotational"`
	Removable         bool      `json:"removable"`
	ReadOnly          bool      `json:"readOnly"`
	Transport         Transport `json:"transport"`
	ByPath            string    `json:"byPath"` // udev-style by-path name, without /dev/disk/by-path/
	PCIAddress        string    `json:"pciAddress"`
	// Firmware is the disk's firmware revision as the disk reports it (NVMe: the controller's
	// firmware_rev; SCSI and ATA: the device's rev); "" where the transport has none (virtio).
	Firmware string `json:"firmware"`
}

// NIC is one physical network interface.
type NIC struct {
	Name       string `json:"name"`
	MAC        string `json:"mac"`
	Driver     string `json:"driver"`
	SpeedMbps  int    `json:"speedMbps"` // 0 when unknown or link down
	Carrier    bool   `json:"carrier"`
	PCIAddress string `json:"pciAddress"`
	Modalias   string `json:"modalias"`
	Firmware   string `json:"firmware"` // the NIC's firmware version (ethtool's firmware-version); "" when unknown
}

// PCIDevice is one function on the PCI bus.
type PCIDevice struct {
	Address  string `json:"address"`
	Vendor   string `json:"vendor"` // 4 hex digits, lower case, e.g. 10de
	Device   string `json:"device"`
	Class    string `json:"class"` // 6 hex digits, e.g. 030200
	Driver   string `json:"driver"`
	Modalias string `json:"modalias"`
	GPU      bool   `json:"gpu"`    // display controller (class 03xxxx)
	NVIDIA   bool   `json:"nvidia"` // vendor 10de
}

// DMI is the SMBIOS identity as the kernel exports it.
type DMI struct {
	ProductUUID   string `json:"productUuid"`
	ProductSerial string `json:"productSerial"`
	ProductName   string `json:"productName"`
	SysVendor     string `json:"sysVendor"`
	BoardSerial   string `json:"boardSerial"`
	BIOSVendor    string `json:"biosVendor"`
	BIOSVersion   string `json:"biosVersion"`
	BIOSDate      string `json:"biosDate"`
}

// Skipped records a device Collect saw and did not report.
type Skipped struct {
	Kind   string `json:"kind"` // "disk" or "nic"
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// NVIDIAVendor is NVIDIA's PCI vendor ID.
const NVIDIAVendor = "10de"

// HasNVIDIAGPU reports whether any PCI display controller is NVIDIA's.
func (inv Inventory) HasNVIDIAGPU() bool {
	return slices.ContainsFunc(inv.PCI, func(d PCIDevice) bool { return d.GPU && d.NVIDIA })
}

// Collect reads the inventory under roots.
func Collect(ctx context.Context, roots Roots, opts Options) (Inventory, error) {
	r := roots.withDefaults()
	var inv Inventory
	var err error
	steps := []struct {
		what string
		run  func() error
	}{
		{"cpu", func() error { inv.CPU, err = readCPU(r); return err }},
		{"memory", func() error { inv.Memory, err = readMemory(r); return err }},
		{"disks", func() error {
			var skipped []Skipped
			inv.Disks, skipped, err = readDisks(r, opts)
			inv.Skipped = append(inv.Skipped, skipped...)
			return err
		}},
		{"nics", func() error {
			var skipped []Skipped
			inv.NICs, skipped, err = readNICs(r, opts.NICFirmware)
			inv.Skipped = append(inv.Skipped, skipped...)
			return err
		}},
		{"pci", func() error { inv.PCI, err = readPCI(r); return err }},
		{"dmi", func() error { inv.DMI = readDMI(r); return nil }},
		{"boot mode", func() error { inv.BootMode = readBootMode(r); return nil }},
	}
	for _, s := range steps {
		if err := ctx.Err(); err != nil {
			return Inventory{}, fmt.Errorf("collecting inventory: %w", err)
		}
		if err := s.run(); err != nil {
			return Inventory{}, fmt.Errorf("collecting inventory (%s): %w", s.what, err)
		}
	}
	inv.FirmwareHints = FirmwareHints(inv)
	// Stable empty slices so the JSON shape does not depend on the machine.
	inv.Disks = nonNil(inv.Disks)
	inv.NICs = nonNil(inv.NICs)
	inv.PCI = nonNil(inv.PCI)
	inv.FirmwareHints = nonNil(inv.FirmwareHints)
	inv.Skipped = nonNil(inv.Skipped)
	inv.CPU.Flags = nonNil(inv.CPU.Flags)
	return inv, nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// readString returns the trimmed content of a sysfs attribute, "" if it does not exist.
func readString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.ToValidUTF8(string(b), ""))
}

func readUint(path string) (uint64, bool) {
	v, err := strconv.ParseUint(readString(path), 0, 64)
	return v, err == nil
}

// linkBase is the last element of a symlink's target ("" when it is not a link).
func linkBase(path string) string {
	t, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

// interestingCPUFlags are the flags worth reporting: virtualisation, crypto, vector width.
func interestingCPUFlags() []string {
	return []string{"aes", "avx", "avx2", "avx512f", "hypervisor", "lm", "nx", "pdpe1gb", "sha_ni", "sse4_2", "svm", "vmx"}
}

func readCPU(r Roots) (CPU, error) {
	b, err := os.ReadFile(filepath.Join(r.Proc, "cpuinfo"))
	if err != nil {
		return CPU{}, fmt.Errorf("reading cpuinfo: %w", err)
	}
	return ParseCPUInfo(string(b)), nil
}

// ParseCPUInfo summarises /proc/cpuinfo (x86 layout; other layouts give threads and model only).
func ParseCPUInfo(s string) CPU {
	var c CPU
	type core struct{ pkg, id string }
	cores := map[core]bool{}
	sockets := map[string]bool{}
	var pkg, coreID string
	flags := map[string]bool{}
	flush := func() {
		if pkg != "" || coreID != "" {
			cores[core{pkg, coreID}] = true
			sockets[pkg] = true
		}
		pkg, coreID = "", ""
	}
	for line := range strings.Lines(s) {
		k, v, ok := strings.Cut(line, ":")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok {
			if k == "" {
				flush()
			}
			continue
		}
		switch k {
		case "processor":
			c.Threads++
		case "model name", "Model", "cpu model":
			if c.Model == "" {
				c.Model = v
			}
		case "physical id":
			pkg = v
		case "core id":
			coreID = v
		case "flags", "Features":
			for f := range strings.FieldsSeq(v) {
				flags[f] = true
			}
		}
	}
	flush()
	c.Cores = len(cores)
	c.Sockets = len(sockets)
	if c.Cores == 0 {
		c.Cores = c.Threads
	}
	if c.Sockets == 0 && c.Threads > 0 {
		c.Sockets = 1
	}
	for _, f := range interestingCPUFlags() {
		if flags[f] {
			c.Flags = append(c.Flags, f)
		}
	}
	return c
}

func readMemory(r Roots) (Memory, error) {
	b, err := os.ReadFile(filepath.Join(r.Proc, "meminfo"))
	if err != nil {
		return Memory{}, fmt.Errorf("reading meminfo: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(rest)
			if len(f) == 0 {
				break
			}
			kb, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				return Memory{}, fmt.Errorf("parsing MemTotal %q: %w", f[0], err)
			}
			return Memory{TotalBytes: kb * 1024}, nil
		}
	}
	return Memory{}, errors.New("meminfo has no MemTotal line")
}

// skipDiskReason says why a block device is not reported, "" when it is.
func skipDiskReason(name string) string {
	prefixes := []struct{ prefix, reason string }{
		{"loop", "loop device"},
		{"ram", "RAM disk"},
		{"zram", "compressed RAM disk"},
		{"dm-", "device-mapper volume"},
		{"md", "software RAID volume"},
		{"nbd", "network block device"},
		{"sr", "optical drive"},
		{"fd", "floppy drive"},
	}
	for _, p := range prefixes {
		if strings.HasPrefix(name, p.prefix) {
			return p.reason
		}
	}
	return ""
}

// isEMMCRPMB matches an eMMC's replay-protected memory block, mmcblkNrpmb. Pure.
func isEMMCRPMB(name string) bool {
	dev, ok := strings.CutPrefix(name, "mmcblk")
	if !ok {
		return false
	}
	dev, ok = strings.CutSuffix(dev, "rpmb")
	return ok && dev != "" && strings.Trim(dev, "0123456789") == ""
}

// isPCIAddress matches "dddd:bb:dd.f" in lower-case hex.
func isPCIAddress(s string) bool {
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' || s[11] < '0' || s[11] > '7' {
		return false
	}
	for i, c := range s[:10] {
		if i == 4 || i == 7 {
			continue
		}
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// devicePath resolves a sysfs class entry to its /sys/devices path relative to the sys root.
func devicePath(sysRoot, link string) string {
	t, err := filepath.EvalSymlinks(link)
	if err != nil {
		return ""
	}
	root, err := filepath.EvalSymlinks(sysRoot)
	if err != nil {
		return ""
	}
	rel, err := filepath.Rel(root, t)
	if err != nil {
		return ""
	}
	return "/" + filepath.ToSlash(rel)
}

// lastPCIAddress is the PCI function nearest to the device in a /devices path.
func lastPCIAddress(devPath string) string {
	parts := strings.Split(devPath, "/")
	for i := len(parts) - 1; i >= 0; i-- {
		if isPCIAddress(parts[i]) {
			return parts[i]
		}
	}
	return ""
}

// ClassifyTransport derives the transport from a disk's /devices path and kernel name.
func ClassifyTransport(name, devPath string) Transport {
	switch {
	case strings.HasPrefix(name, "nvme") || strings.Contains(devPath, "/nvme/"):
		return TransportNVMe
	case strings.Contains(devPath, "/usb"):
		return TransportUSB
	case strings.HasPrefix(name, "vd") || strings.Contains(devPath, "/virtio"):
		// virtio-scsi disks are named sdX but sit under virtioN/hostN: still virtio.
		return TransportVirtio
	case strings.Contains(devPath, "/ata"):
		return TransportSATA
	case strings.Contains(devPath, "/end_device-") || strings.Contains(devPath, "/port-"):
		return TransportSAS
	case strings.HasPrefix(name, "mmcblk"):
		return TransportMMC
	case strings.Contains(devPath, "/host") && strings.Contains(devPath, "/target"):
		return TransportSCSI
	}
	return TransportUnknown
}

// pathElem returns the part after prefix of the first path element that starts with prefix and
// whose remainder is accepted by ok.
func pathElem(devPath, prefix string, ok func(string) bool) string {
	for p := range strings.SplitSeq(devPath, "/") {
		if rest, found := strings.CutPrefix(p, prefix); found && ok(rest) {
			return rest
		}
	}
	return ""
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// isSCSIAddress matches "h:c:t:l".
func isSCSIAddress(s string) bool {
	f := strings.Split(s, ":")
	return len(f) == 4 && !slices.ContainsFunc(f, func(x string) bool { return !isDigits(x) })
}

// ByPath builds a udev-like by-path name from the /devices path (udev is not in the ramdisk).
func ByPath(name string, t Transport, devPath string) string {
	pci := lastPCIAddress(devPath)
	if pci == "" {
		return ""
	}
	base := "pci-" + pci
	switch t {
	case TransportNVMe:
		if i := strings.LastIndexByte(name, 'n'); i > 0 && isDigits(name[i+1:]) {
			return base + "-nvme-" + name[i+1:]
		}
	case TransportSATA:
		if port := pathElem(devPath, "ata", isDigits); port != "" {
			return base + "-ata-" + port
		}
	case TransportSAS, TransportSCSI, TransportVirtio:
		if addr := pathElem(devPath, "", isSCSIAddress); addr != "" {
			return base + "-scsi-" + addr
		}
	}
	return base
}

// parseVPD80 extracts the unit serial number from a SCSI VPD page 0x80.
func parseVPD80(b []byte) string {
	if len(b) < 4 || b[1] != 0x80 {
		return ""
	}
	n := int(b[2])<<8 | int(b[3])
	if 4+n > len(b) {
		n = len(b) - 4
	}
	return strings.TrimSpace(strings.ToValidUTF8(string(b[4:4+n]), ""))
}

// parseVPD83 extracts the first NAA (or EUI-64) designator from a SCSI VPD page 0x83 as "naa.<hex>".
func parseVPD83(b []byte) string {
	if len(b) < 4 || b[1] != 0x83 {
		return ""
	}
	end := 4 + (int(b[2])<<8 | int(b[3]))
	end = min(end, len(b))
	var eui string
	for off := 4; off+4 <= end; {
		codeSet := b[off] & 0x0f
		assoc := (b[off+1] >> 4) & 0x3
		typ := b[off+1] & 0x0f
		l := int(b[off+3])
		if off+4+l > end {
			break
		}
		id := b[off+4 : off+4+l]
		if codeSet == 1 && assoc == 0 { // binary, addressed logical unit
			switch typ {
			case 3:
				return fmt.Sprintf("naa.%x", id)
			case 2:
				if eui == "" {
					eui = fmt.Sprintf("eui.%x", id)
				}
			}
		}
		off += 4 + l
	}
	return eui
}

func readDisks(r Roots, opts Options) ([]Disk, []Skipped, error) {
	dir := filepath.Join(r.Sys, "block")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	var disks []Disk
	var skipped []Skipped
	for _, e := range entries {
		name := e.Name()
		if isEMMCRPMB(name) {
			// Older kernels list it as a block device; it takes only authenticated frames
			// (no read or write of data), so nothing can be stored on it or wiped from it.
			skipped = append(skipped, Skipped{Kind: "disk", Name: name, Reason: "eMMC replay-protected memory block (authenticated access only)"})
			continue
		}
		if reason := skipDiskReason(name); reason != "" && !opts.IncludeVirtualDisks {
			skipped = append(skipped, Skipped{Kind: "disk", Name: name, Reason: reason})
			continue
		}
		d, reason, err := readDisk(r, name)
		if err != nil {
			return nil, nil, fmt.Errorf("reading disk %s: %w", name, err)
		}
		if reason != "" {
			skipped = append(skipped, Skipped{Kind: "disk", Name: name, Reason: reason})
			continue
		}
		disks = append(disks, d)
	}
	return disks, skipped, nil
}

func readDisk(r Roots, name string) (Disk, string, error) {
	base := filepath.Join(r.Sys, "block", name)
	if hidden, _ := readUint(filepath.Join(base, "hidden")); hidden == 1 {
		// NVMe native multipath lists each path (nvme0c0n1) beside the multipath head
		// (nvme0n1); a path has no /dev node and is written through its head.
		return Disk{}, "hidden block device (an NVMe multipath path: its namespace is reported as its multipath head)", nil
	}
	sectors, ok := readUint(filepath.Join(base, "size"))
	if !ok {
		return Disk{}, "", fmt.Errorf("no readable size attribute in %s", base)
	}
	if sectors == 0 {
		return Disk{}, "no medium (size 0)", nil
	}
	devPath := devicePath(r.Sys, base)
	d := Disk{
		Name:      name,
		Path:      filepath.Join(r.Dev, name),
		SizeBytes: sectors * 512, // sysfs size is always in 512-byte units
		Transport: ClassifyTransport(name, devPath),
	}
	lbs, _ := readUint(filepath.Join(base, "queue", "logical_block_size"))
	pbs, _ := readUint(filepath.Join(base, "queue", "physical_block_size"))
	d.LogicalBlockSize, d.PhysicalBlockSize = uint32(cmp.Or(lbs, 512)), uint32(cmp.Or(pbs, lbs, 512))
	rot, _ := readUint(filepath.Join(base, "queue", "rotational"))
	d.Rotational = rot == 1
	rem, _ := readUint(filepath.Join(base, "removable"))
	d.Removable = rem == 1
	ro, _ := readUint(filepath.Join(base, "ro"))
	d.ReadOnly = ro == 1
	dev := filepath.Join(base, "device")
	d.Model = readString(filepath.Join(dev, "model"))
	d.Serial = cmp.Or(readString(filepath.Join(dev, "serial")), readString(filepath.Join(base, "serial")))
	if d.Serial == "" {
		if b, err := os.ReadFile(filepath.Join(dev, "vpd_pg80")); err == nil {
			d.Serial = parseVPD80(b)
		}
	}
	d.WWN = cmp.Or(readString(filepath.Join(base, "wwid")), readString(filepath.Join(dev, "wwid")))
	if d.WWN == "" {
		if b, err := os.ReadFile(filepath.Join(dev, "vpd_pg83")); err == nil {
			d.WWN = parseVPD83(b)
		}
	}
	d.Firmware = cmp.Or(readString(filepath.Join(dev, "firmware_rev")), readString(filepath.Join(dev, "rev")))
	d.PCIAddress = lastPCIAddress(devPath)
	d.ByPath = ByPath(name, d.Transport, devPath)
	if link := byPathLink(r, name); link != "" {
		d.ByPath = link // udev's own name wins when udev ran
	}
	return d, "", nil
}

// byPathLink finds the /dev/disk/by-path entry for name, if udev created one.
func byPathLink(r Roots, name string) string {
	dir := filepath.Join(r.Dev, "disk", "by-path")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	for _, e := range entries {
		if e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		if linkBase(filepath.Join(dir, e.Name())) == name {
			return e.Name()
		}
	}
	return ""
}

func readNICs(r Roots, firmware func(name string) string) ([]NIC, []Skipped, error) {
	dir := filepath.Join(r.Sys, "class", "net")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	var nics []NIC
	var skipped []Skipped
	for _, e := range entries {
		name := e.Name()
		base := filepath.Join(dir, name)
		if name == "lo" {
			skipped = append(skipped, Skipped{Kind: "nic", Name: name, Reason: "loopback"})
			continue
		}
		if _, err := os.Stat(filepath.Join(base, "device")); err != nil {
			skipped = append(skipped, Skipped{Kind: "nic", Name: name, Reason: "virtual interface (no backing device)"})
			continue
		}
		n := NIC{
			Name:     name,
			MAC:      strings.ToLower(readString(filepath.Join(base, "address"))),
			Driver:   linkBase(filepath.Join(base, "device", "driver")),
			Modalias: readString(filepath.Join(base, "device", "modalias")),
		}
		c, _ := readUint(filepath.Join(base, "carrier"))
		n.Carrier = c == 1
		if s, err := strconv.Atoi(readString(filepath.Join(base, "speed"))); err == nil && s > 0 && n.Carrier {
			n.SpeedMbps = s
		}
		n.PCIAddress = lastPCIAddress(devicePath(r.Sys, base))
		if n.Modalias == "" || strings.HasPrefix(n.Modalias, "virtio:") {
			// For virtio the PCI function's modalias is the useful one for firmware hints.
			if n.PCIAddress != "" {
				n.Modalias = cmp.Or(readString(filepath.Join(r.Sys, "bus", "pci", "devices", n.PCIAddress, "modalias")), n.Modalias)
			}
		}
		if firmware != nil {
			n.Firmware = firmware(name)
		}
		nics = append(nics, n)
	}
	return nics, skipped, nil
}

func readPCI(r Roots) ([]PCIDevice, error) {
	dir := filepath.Join(r.Sys, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // no PCI bus (some VMs, other architectures)
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", dir, err)
	}
	var devs []PCIDevice
	for _, e := range entries {
		base := filepath.Join(dir, e.Name())
		d := PCIDevice{
			Address:  e.Name(),
			Vendor:   strings.TrimPrefix(strings.ToLower(readString(filepath.Join(base, "vendor"))), "0x"),
			Device:   strings.TrimPrefix(strings.ToLower(readString(filepath.Join(base, "device"))), "0x"),
			Class:    strings.TrimPrefix(strings.ToLower(readString(filepath.Join(base, "class"))), "0x"),
			Driver:   linkBase(filepath.Join(base, "driver")),
			Modalias: readString(filepath.Join(base, "modalias")),
		}
		d.GPU = strings.HasPrefix(d.Class, "03")
		d.NVIDIA = d.Vendor == NVIDIAVendor
		devs = append(devs, d)
	}
	return devs, nil
}

func readDMI(r Roots) DMI {
	dir := filepath.Join(r.Sys, "class", "dmi", "id")
	f := func(n string) string { return readString(filepath.Join(dir, n)) }
	return DMI{
		ProductUUID:   strings.ToLower(f("product_uuid")),
		ProductSerial: f("product_serial"),
		ProductName:   f("product_name"),
		SysVendor:     f("sys_vendor"),
		BoardSerial:   f("board_serial"),
		BIOSVendor:    f("bios_vendor"),
		BIOSVersion:   f("bios_version"),
		BIOSDate:      f("bios_date"),
	}
}

func readBootMode(r Roots) BootMode {
	if _, err := os.Stat(filepath.Join(r.Sys, "firmware", "efi")); err == nil {
		return BootUEFI
	}
	return BootBIOS
}

// firmwareVersion is the NUL-terminated firmware-version field of an ethtool driver answer,
// trimmed; "" for none ("N/A"). Pure.
func firmwareVersion(field []byte) string {
	if i := strings.IndexByte(string(field), 0); i >= 0 {
		field = field[:i]
	}
	v := strings.TrimSpace(string(field))
	if strings.EqualFold(v, "N/A") {
		return ""
	}
	return v
}
