package wipe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"bcd/internal/ramdisk/inventory"
)

// HiddenCapacity implements HiddenCapacityProber: an ATA disk's native max address against the
// size the kernel shows. NVMe namespaces are judged per subsystem by WipeAll (InspectNVMe).
func (d *BlockDevice) HiddenCapacity(ctx context.Context) (HiddenCapacity, error) {
	switch {
	case !d.block:
		return HiddenCapacity{Detail: "not applicable: a regular file"}, nil
	case strings.HasPrefix(d.name, "nvme"):
		return HiddenCapacity{Detail: "not checked per namespace: NVMe namespaces and capacity are checked per NVM subsystem"}, nil
	case !d.isATA():
		return HiddenCapacity{Detail: "not checked: not an ATA or NVMe disk (no host protected area or namespaces to read)"}, nil
	}
	if err := ctx.Err(); err != nil {
		return HiddenCapacity{}, err
	}
	fd := int(d.buffered.Fd())
	id := AlignedBuffer(512)
	if err := sgATA(fd, ataIdentify, ataProtoPIOIn, id, 10*time.Second); err != nil {
		return HiddenCapacity{}, fmt.Errorf("ATA IDENTIFY DEVICE on %s: %w", d.name, err)
	}
	c, err := parseATACapacity(id)
	if err != nil {
		return HiddenCapacity{}, fmt.Errorf("%s: %w", d.name, err)
	}
	p := ataProbe{kernelSectors: uint64(d.size / d.lbs), id: c}
	if cmd, feature, ext, name, ok := ataNativeMaxCommand(c); ok {
		regs, err := sgATARegs(fd, cmd, feature, ext, 10*time.Second)
		if err != nil {
			return HiddenCapacity{}, fmt.Errorf("%s on %s: %w", name, d.name, err)
		}
		p.nativeCmd, p.nativeMax = name, regs.lba
	}
	if c.dco {
		// DEVICE CONFIGURATION IDENTIFY (B1h, feature C2h), one sector in. A drive may refuse it
		// (the firmware froze the overlay): that is reported, not failed.
		cdb := ataPassThrough16(ataDeviceConfiguration, ataProtoPIOIn)
		cdb[4] = ataDCOIdentify
		buf := AlignedBuffer(512)
		err := sgATACDB(fd, cdb, ataProtoPIOIn, buf, 10*time.Second)
		if err == nil {
			p.dcoMax, err = parseDCOIdentify(buf)
		}
		if err != nil {
			p.dcoErr = err.Error()
		} else {
			p.dcoRead = true
		}
	}
	return ataHidden(p), nil
}

// DEVICE CONFIGURATION (B1h) and its IDENTIFY subcommand (feature C2h), ATA8-ACS §7.10.
const (
	ataDeviceConfiguration = 0xb1
	ataDCOIdentify         = 0xc2
)

// ataRegsPassThrough16 builds an ATA PASS-THROUGH (16) CDB (SAT-3 §12.2.2) for a non-data
// command that returns its output registers: PROTOCOL 3 (non-data) and EXTEND in byte 1,
// CK_COND in byte 2 (the registers come back as an ATA Status Return descriptor), FEATURE
// 15:8/7:0 in bytes 3/4, DEVICE (LBA mode) in byte 13 and the command in byte 14.
func ataRegsPassThrough16(cmd uint8, feature uint16, ext bool) [16]byte {
	var cdb [16]byte
	cdb[0] = 0x85
	cdb[1] = ataProtoNonData << 1
	if ext {
		cdb[1] |= 1
	}
	cdb[2] = 0x20
	cdb[3], cdb[4] = byte(feature>>8), byte(feature)
	cdb[13] = 0x40
	cdb[14] = cmd
	return cdb
}

// sgATARegs runs a non-data ATA command through SG_IO and returns the drive's output registers.
// libata answers CK_COND with CHECK CONDITION, sense key RECOVERED ERROR and descriptor-format
// sense holding the ATA Status Return descriptor; ERR in its status, or no descriptor, fails.
func sgATARegs(fd int, cmd uint8, feature uint16, ext bool, timeout time.Duration) (ataRegs, error) {
	cdb := ataRegsPassThrough16(cmd, feature, ext)
	sense := make([]byte, 64)
	h := sgIOHdr{
		InterfaceID: 'S', DxferDirection: sgDxferNone, CmdLen: uint8(len(cdb)), MxSbLen: uint8(len(sense)),
		Cmdp: unsafe.Pointer(&cdb[0]), Sbp: unsafe.Pointer(&sense[0]), Timeout: uint32(timeout.Milliseconds()),
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), sgIO, uintptr(unsafe.Pointer(&h))); e != 0 {
		return ataRegs{}, ioctlErr(e)
	}
	if h.HostStatus != 0 || h.DriverStatus&0xf != 0 {
		return ataRegs{}, fmt.Errorf("ATA command %#x via SG_IO failed: host %#x driver %#x", cmd, h.HostStatus, h.DriverStatus)
	}
	regs, ok := parseATAStatusReturn(sense[:min(int(h.SbLenWr), len(sense))])
	if !ok {
		return ataRegs{}, fmt.Errorf("ATA command %#x: no ATA status return in the sense data (scsi status %#x): the registers cannot be read", cmd, h.Status)
	}
	if regs.status&0x01 != 0 {
		return ataRegs{}, fmt.Errorf("ATA command %#x failed: status %#x error %#x", cmd, regs.status, regs.error)
	}
	if ext && !regs.ext {
		return ataRegs{}, fmt.Errorf("ATA command %#x: the answer lacks the 48-bit registers", cmd)
	}
	return regs, nil
}

// nvmeCharDev is an NVMe controller's character device (/dev/nvmeN): admin commands only.
type nvmeCharDev struct{ f *os.File }

// Identify implements NVMeAdmin with NVME_IOCTL_ADMIN_CMD: struct nvme_passthru_cmd (nvmeAdminCmd,
// 72 bytes, include/uapi/linux/nvme_ioctl.h) with opcode 06h, nsid, and CDW10 bits 7:0 = CNS
// (CNTID, bits 31:16, 0).
func (n nvmeCharDev) Identify(_ context.Context, cns uint8, nsid uint32, buf []byte) error {
	if len(buf) != nvmeIdentifySize {
		return fmt.Errorf("identify buffer of %d bytes, want %d", len(buf), nvmeIdentifySize)
	}
	data := AlignedBuffer(nvmeIdentifySize)
	c := &nvmeAdminCmd{Opcode: nvmeOpIdentify, NSID: nsid, Cdw10: uint32(cns), TimeoutMs: 10_000}
	if err := nvmeAdmin(int(n.f.Fd()), c, data); err != nil {
		return err
	}
	copy(buf, data)
	return nil
}

// InspectNVMe implements NVMeInspector: every controller under /sys/class/nvme, read through
// /dev/nvmeN, and the namespace ID and subsystem of each disk that is an NVMe namespace.
func (o LinuxOpener) InspectNVMe(ctx context.Context, disks []inventory.Disk) (NVMeInventory, error) {
	return inspectNVMe(ctx, cmp.Or(o.Options.SysRoot, "/sys"), disks, func(name string) (NVMeAdmin, func() error, error) {
		f, err := os.OpenFile(filepath.Join("/dev", name), os.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return nil, nil, err
		}
		return nvmeCharDev{f}, f.Close, nil
	})
}

// openNVMeAdmin opens controller name (nvme0) for admin commands.
type openNVMeAdmin func(name string) (NVMeAdmin, func() error, error)

// inspectNVMe reads the controllers listed under sysRoot/class/nvme through open, and the
// namespace ID (sysfs nsid) and subsystem NQN (device/subsysnqn: the controller's, or the
// multipath head's subsystem's) of every disk named nvme*. A controller that cannot be read, or
// an NVMe disk whose namespace cannot be told, fails the inspection: nothing is assumed.
func inspectNVMe(ctx context.Context, sysRoot string, disks []inventory.Disk, open openNVMeAdmin) (NVMeInventory, error) {
	var inv NVMeInventory
	dir := filepath.Join(sysRoot, "class", "nvme")
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) { // no directory: the nvme driver is not loaded
		return NVMeInventory{}, fmt.Errorf("listing %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "nvme") || !isDigits(strings.TrimPrefix(name, "nvme")) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return NVMeInventory{}, err
		}
		subsys := sysString(filepath.Join(dir, name, "subsysnqn"))
		a, closeFn, err := open(name)
		if err != nil {
			return NVMeInventory{}, fmt.Errorf("opening NVMe controller %s: %w", name, err)
		}
		c, err := ReadNVMeController(ctx, name, subsys, a)
		err = errors.Join(err, closeFn())
		if err != nil {
			return NVMeInventory{}, err
		}
		inv.Controllers = append(inv.Controllers, c)
	}
	for _, d := range disks {
		if !strings.HasPrefix(d.Name, "nvme") {
			continue
		}
		base := filepath.Join(sysRoot, "block", d.Name)
		nsid, err := strconv.ParseUint(sysString(filepath.Join(base, "nsid")), 10, 32)
		if err != nil || nsid == 0 {
			return NVMeInventory{}, fmt.Errorf("NVMe disk %s: no namespace ID in %s: the disk cannot be matched to its controller", d.Name, filepath.Join(base, "nsid"))
		}
		inv.Namespaces = append(inv.Namespaces, NVMeNamespace{Disk: d.Name, Subsystem: sysString(filepath.Join(base, "device", "subsysnqn")), NSID: uint32(nsid)})
	}
	return inv, nil
}

func sysString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
