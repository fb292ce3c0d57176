package lab

import (
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
)

// Defaults of a lab.
const (
	DefaultNetNS       = "bcdlab"
	DefaultBridge      = "bcdbr0"
	DefaultMemoryMiB   = 1024
	DefaultDiskSize    = 4 << 30 // sparse
	DefaultQEMU        = "qemu-system-x86_64"
	DefaultOVMFCode    = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	DefaultOVMFVars    = "/usr/share/OVMF/OVMF_VARS_4M.fd"
	DefaultRedfishPort = 8000 // VM i's Redfish BMC listens on bridge:8000+i
	DefaultIPMIPort    = 6230 // VM i's IPMI BMC listens on bridge:6230+i (UDP)
	// maxSocketPath is the longest unix socket path (sun_path holds 108 bytes with the NUL).
	maxSocketPath = 107
	// MaxVMs bounds a lab: the port ranges of the BMCs and the DHCP range stay apart.
	MaxVMs = 64
)

// DefaultBridgeIPv4 and DefaultBridgeIPv6 are the bridge's addresses (private; the namespace is
// isolated, so two labs in two namespaces may both use them).
func DefaultBridgeIPv4() netip.Prefix { return netip.MustParsePrefix("172.30.0.1/24") }

// DefaultBridgeIPv6 is a ULA ("bcdla" in its global id) for router advertisements.
func DefaultBridgeIPv6() netip.Prefix { return netip.MustParsePrefix("fd62:6364:6c61::1/64") }

// Options are what a user chooses for a lab; zero values take the defaults.
type Options struct {
	VMs        int
	Firmware   FirmwareChoice
	Dir        string // absolute
	NetNS      string
	Bridge     string
	BridgeIPv4 netip.Prefix
	BridgeIPv6 netip.Prefix
	MemoryMiB  int
	DiskBus    DiskBus
	DiskSize   int64
	QEMU       string
	OVMFCode   string
	OVMFVars   string
}

// validIfName accepts Linux interface (and our namespace) names: 1 to 15 characters, a letter
// first, then letters, digits, '.', '_' or '-'.
func validIfName(s string) bool {
	if len(s) < 1 || len(s) > 15 {
		return false
	}
	for i, c := range []byte(s) {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		other := c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !letter && (i == 0 || !other) {
			return false
		}
	}
	return true
}

// Plan turns options into the full lab layout: names, MACs, UUIDs, addresses, ports and paths
// of every VM. It is pure: the same options always give the same lab.
func Plan(o Options) (Spec, error) {
	if o.VMs < 1 || o.VMs > MaxVMs {
		return Spec{}, fmt.Errorf("planning lab: %d VMs: accepted are 1 to %d", o.VMs, MaxVMs)
	}
	if o.Dir == "" || !filepath.IsAbs(o.Dir) {
		return Spec{}, fmt.Errorf("planning lab: directory %q must be an absolute path", o.Dir)
	}
	def := func(s *string, d string) {
		if *s == "" {
			*s = d
		}
	}
	def((*string)(&o.Firmware), string(ChoiceBIOS))
	def(&o.NetNS, DefaultNetNS)
	def(&o.Bridge, DefaultBridge)
	def((*string)(&o.DiskBus), string(DiskVirtio))
	def(&o.QEMU, DefaultQEMU)
	def(&o.OVMFCode, DefaultOVMFCode)
	def(&o.OVMFVars, DefaultOVMFVars)
	if !o.BridgeIPv4.IsValid() {
		o.BridgeIPv4 = DefaultBridgeIPv4()
	}
	if !o.BridgeIPv6.IsValid() {
		o.BridgeIPv6 = DefaultBridgeIPv6()
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = DefaultMemoryMiB
	}
	if o.DiskSize == 0 {
		o.DiskSize = DefaultDiskSize
	}
	switch o.Firmware {
	case ChoiceBIOS, ChoiceUEFI, ChoiceMixed:
	default:
		return Spec{}, fmt.Errorf("planning lab: firmware %q: accepted are bios, uefi, mixed", o.Firmware)
	}
	switch o.DiskBus {
	case DiskVirtio, DiskNVMe, DiskMixed:
	default:
		return Spec{}, fmt.Errorf("planning lab: disk bus %q: accepted are virtio, nvme, mixed", o.DiskBus)
	}
	if !validIfName(o.NetNS) || !validIfName(o.Bridge) {
		return Spec{}, fmt.Errorf("planning lab: namespace %q and bridge %q must be 1 to 15 letters, digits, '.', '_' or '-'", o.NetNS, o.Bridge)
	}
	if o.MemoryMiB < 128 || o.MemoryMiB > 1024 {
		return Spec{}, fmt.Errorf("planning lab: memory %d MiB: accepted are 128 to 1024", o.MemoryMiB)
	}
	if o.DiskSize < 1<<20 {
		return Spec{}, errors.New("planning lab: disk size must be at least 1 MiB")
	}
	v4 := o.BridgeIPv4
	if !v4.Addr().Is4() || v4.Bits() > 24 || v4.Addr() == v4.Masked().Addr() {
		return Spec{}, fmt.Errorf("planning lab: bridge IPv4 %s: need a host address in a /24 or larger", v4)
	}
	v6 := o.BridgeIPv6
	if !v6.Addr().Is6() || v6.Addr().Is4In6() || v6.Bits() != 64 || v6.Addr() == v6.Masked().Addr() {
		return Spec{}, fmt.Errorf("planning lab: bridge IPv6 %s: need a host address in a /64 (SLAAC)", v6)
	}
	start, end, err := dhcpRange(v4)
	if err != nil {
		return Spec{}, fmt.Errorf("planning lab: %w", err)
	}

	s := Spec{
		Dir: o.Dir, NetNS: o.NetNS, Bridge: o.Bridge, BridgeIPv4: v4, BridgeIPv6: v6,
		DHCPStart: start, DHCPEnd: end,
		QEMU: o.QEMU, OVMFCode: o.OVMFCode, OVMFVars: o.OVMFVars,
		Credentials: filepath.Join(o.Dir, CredentialsFile),
	}
	for i := range o.VMs {
		name := VMName(i)
		dir := filepath.Join(o.Dir, name)
		vm := VM{
			Index: i, Name: name, Firmware: FirmwareFor(o.Firmware, i),
			MAC: MAC(i), UUID: VMUUID(i), Serial: fmt.Sprintf("BCDLAB%04d", i), Tap: fmt.Sprintf("bcdtap%d", i),
			MemoryMiB: o.MemoryMiB, DiskBus: DiskBusFor(o.DiskBus, i), DiskSize: o.DiskSize,
			Dir: dir, Disk: filepath.Join(dir, "disk.raw"),
			QMPSocket: filepath.Join(dir, "qmp.sock"), QMPMonitor: filepath.Join(dir, "monitor.sock"), InbandSocket: filepath.Join(dir, "bmc-inband.sock"),
			Console: filepath.Join(dir, "console.log"), SerialSocket: filepath.Join(dir, "serial.sock"), QEMULog: filepath.Join(dir, "qemu.log"),
			RedfishAddr: netip.AddrPortFrom(v4.Addr(), uint16(DefaultRedfishPort+i)).String(),
			IPMIAddr:    netip.AddrPortFrom(v4.Addr(), uint16(DefaultIPMIPort+i)).String(),
		}
		if slices.ContainsFunc([]string{vm.QMPMonitor, vm.QMPSocket, vm.InbandSocket, vm.SerialSocket}, func(p string) bool { return len(p) > maxSocketPath }) {
			return Spec{}, fmt.Errorf("planning lab: directory %q is too long for the VMs' unix socket paths (at most %d bytes)", o.Dir, maxSocketPath)
		}
		if vm.Firmware == FirmwareUEFI {
			vm.OVMFVars = filepath.Join(dir, "OVMF_VARS.fd")
		}
		s.VMs = append(s.VMs, vm)
	}
	return s, nil
}

// dhcpRange picks .100–.199 of the bridge's subnet (for a /24; the same offsets in larger ones)
// unless the bridge address falls inside, then .10–.90.
func dhcpRange(p netip.Prefix) (netip.Addr, netip.Addr, error) {
	base := p.Masked().Addr().As4()
	at := func(off byte) netip.Addr {
		b := base
		b[3] += off
		return netip.AddrFrom4(b)
	}
	start, end := at(100), at(199)
	if br := p.Addr(); !br.Less(start) && !end.Less(br) {
		start, end = at(10), at(90)
		if !br.Less(start) && !end.Less(br) {
			return netip.Addr{}, netip.Addr{}, fmt.Errorf("bridge address %s leaves no DHCP range", br)
		}
	}
	return start, end, nil
}

// VMName is the name of VM i.
func VMName(i int) string { return fmt.Sprintf("lab-%d", i) }

// FirmwareFor is VM i's firmware under choice c: mixed alternates BIOS (even) and UEFI (odd).
func FirmwareFor(c FirmwareChoice, i int) Firmware {
	switch c {
	case ChoiceUEFI:
		return FirmwareUEFI
	case ChoiceMixed:
		if i%2 == 1 {
			return FirmwareUEFI
		}
	}
	return FirmwareBIOS
}

// DiskBusFor is VM i's disk bus under choice c: mixed alternates virtio (even) and NVMe (odd).
func DiskBusFor(c DiskBus, i int) DiskBus {
	if c == DiskMixed {
		if i%2 == 1 {
			return DiskNVMe
		}
		return DiskVirtio
	}
	return c
}

// MAC is VM i's NIC address: locally administered, unicast, stable per index
// (02:bc:d1:ab:HH:LL).
func MAC(i int) string {
	return fmt.Sprintf("02:bc:d1:ab:%02x:%02x", (i>>8)&0xff, i&0xff)
}

// VMUUID is VM i's SMBIOS system UUID (version 4 layout, stable per index).
func VMUUID(i int) string {
	return fmt.Sprintf("bcd1ab00-0000-4000-8000-%012x", i)
}
