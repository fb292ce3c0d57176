package lab

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// SerconFile is the fw_cfg blob (the little-endian port 0x3f8) that makes SeaBIOS mirror the
// text console, and so iPXE's output, to the serial port: the VMs have no display.
func SerconFile(dir string) string { return filepath.Join(dir, "sercon-port") }

// SerconBlob is SerconFile's content.
func SerconBlob() []byte { return []byte{0xf8, 0x03} }

// Boot indices at start: the NIC first, as an empty machine boots in a data centre. The virtual
// BMCs rewrite them through QMP (qom-set bootindex); QEMU applies them at the next reset.
const (
	bootIndexNIC  = 1
	bootIndexDisk = 2
	bootIndexCD   = 3
)

// QEMUArgs is the command line of VM vm of lab s (without the program name). It is pure.
//
// The VM starts powered off (-S: prelaunch, which the BMC reports as off) and stays alive when
// the guest shuts down (-no-shutdown), so power is entirely the BMC's: on is system_reset + cont
// through QMP (vbmc.QEMUMachine). -boot strict=on limits booting to the devices that carry a
// bootindex (all three of ours), in their order (LAB-NOTES gotcha 3).
func QEMUArgs(s Spec, vm VM) []string {
	kv := func(pairs ...string) string { return strings.Join(pairs, ",") }
	args := []string{
		"-name", kv(vm.Name, "process=bcdlab-"+vm.Name),
		"-machine", "q35,accel=tcg",
		"-smp", "1",
		"-m", strconv.Itoa(vm.MemoryMiB),
		"-nodefaults", "-no-user-config",
		"-display", "none",
		"-uuid", vm.UUID,
		"-smbios", kv("type=1", "manufacturer=bcd", "product=bcd lab VM", "serial="+vm.Serial, "uuid="+vm.UUID),
		// The serial port: served on a unix socket (the VM's IPMI BMC connects to it for SOL;
		// nobody connected, output is dropped, not held) and logged, whoever is connected.
		"-chardev", kv("socket", "id=console", "path="+vm.SerialSocket, "server=on", "wait=off", "logfile="+vm.Console, "logappend=on"),
		"-serial", "chardev:console",
		"-qmp", kv("unix:"+vm.QMPSocket, "server=on", "wait=off"),
		"-qmp", kv("unix:"+vm.QMPMonitor, "server=on", "wait=off"),
		// The host's IPMI system interface (KCS), forwarded to the VM's IPMI BMC, which
		// listens on the socket (QEMU reconnects: it may start first, and after a BMC restart).
		"-chardev", kv("socket", "id=ipmi0", "path="+vm.InbandSocket, "reconnect=1"),
		"-device", kv("ipmi-bmc-extern", "chardev=ipmi0", "id=bmc0"),
		"-device", kv("isa-ipmi-kcs", "bmc=bmc0"),
		"-no-shutdown", "-S",
		"-boot", "strict=on",
	}
	switch vm.Firmware {
	case FirmwareUEFI:
		args = append(args,
			"-drive", kv("if=pflash", "format=raw", "unit=0", "readonly=on", "file="+s.OVMFCode),
			"-drive", kv("if=pflash", "format=raw", "unit=1", "file="+vm.OVMFVars))
	default:
		args = append(args, "-fw_cfg", kv("name=etc/sercon-port", "file="+SerconFile(s.Dir)))
	}
	// The NIC: QEMU loads its iPXE option ROM for virtio-net (pxe-virtio / efi-virtio) itself.
	args = append(args,
		"-netdev", kv("tap", "id=net0", "ifname="+vm.Tap, "script=no", "downscript=no"),
		"-device", kv("virtio-net-pci", "netdev=net0", "id="+NICDeviceID, "mac="+vm.MAC, fmt.Sprintf("bootindex=%d", bootIndexNIC)),
		"-drive", kv("if=none", "id=disk0-drive", "file="+vm.Disk, "format=raw", "cache=unsafe", "discard=unmap"),
	)
	disk := "virtio-blk-pci"
	if vm.DiskBus == DiskNVMe {
		disk = "nvme"
	}
	args = append(args,
		"-device", kv(disk, "drive=disk0-drive", "id="+DiskDeviceID, "serial="+vm.Serial+"-D0", fmt.Sprintf("bootindex=%d", bootIndexDisk)),
		// An empty CD-ROM on q35's AHCI: virtual media loads ISOs into it.
		"-drive", kv("if=none", "id=cd0-drive", "media=cdrom", "readonly=on"),
		"-device", kv("ide-cd", "drive=cd0-drive", "id="+CDDeviceID, "bus=ide.2", fmt.Sprintf("bootindex=%d", bootIndexCD)),
		// Entropy: TCG has no RDRAND, and the agents' keys and TLS need the kernel's pool.
		"-object", kv("rng-random", "id=rng0", "filename=/dev/urandom"),
		"-device", kv("virtio-rng-pci", "rng=rng0"),
	)
	return args
}
