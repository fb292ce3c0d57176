package wipe

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// nvmeAdminCmd is struct nvme_admin_cmd from <linux/nvme_ioctl.h> (72 bytes).
type nvmeAdminCmd struct {
	Opcode      uint8
	Flags       uint8
	Rsvd1       uint16
	NSID        uint32
	Cdw2        uint32
	Cdw3        uint32
	Metadata    uint64
	Addr        uint64
	MetadataLen uint32
	DataLen     uint32
	Cdw10       uint32
	Cdw11       uint32
	Cdw12       uint32
	Cdw13       uint32
	Cdw14       uint32
	Cdw15       uint32
	TimeoutMs   uint32
	Result      uint32
}

const (
	nvmeIoctlID       = 0x4e40     // _IO('N', 0x40)
	nvmeIoctlAdminCmd = 0xc0484e41 // _IOWR('N', 0x41, struct nvme_admin_cmd)

	nvmeOpGetLogPage = 0x02
	nvmeOpIdentify   = 0x06
	nvmeOpFormat     = 0x80
	nvmeOpSanitize   = 0x84

	nvmeLogSanitize = 0x81
)

// nvmeIDInfo is what the erase plan needs from Identify Controller / Namespace.
type nvmeIDInfo struct {
	sanitizeCrypto   bool
	formatCrypto     bool
	deallocReadsZero bool
	lbaFormat        uint8
}

// parseNVMeIdentify reads SANICAP (bytes 328–331, bit 0: crypto erase), FNA (byte 524, bit 2:
// crypto erase supported as part of format), and from the namespace DLFEAT (byte 33, bits 2:0 =
// 001b: deallocated blocks read as zeros) and FLBAS (byte 26, bits 3:0 and 6:5).
func parseNVMeIdentify(ctrl, ns []byte) nvmeIDInfo {
	var i nvmeIDInfo
	if len(ctrl) >= 4096 {
		i.sanitizeCrypto = binary.LittleEndian.Uint32(ctrl[328:])&1 != 0
		i.formatCrypto = ctrl[524]&(1<<2) != 0
	}
	if len(ns) >= 4096 {
		i.deallocReadsZero = ns[33]&0x7 == 1
		i.lbaFormat = ns[26]&0xf | (ns[26]>>5&0x3)<<4
	}
	return i
}

// nvmeFormatCdw10 builds Format NVM's CDW10: LBAF (bits 3:0, high bits 13:12), SES=2 (bits 11:9).
func nvmeFormatCdw10(lbaf uint8) uint32 {
	return uint32(lbaf&0xf) | 2<<9 | uint32(lbaf>>4&0x3)<<12
}

// nvmeSanitizeCdw10 builds Sanitize's CDW10: SANACT=100b (crypto erase), AUSE=0.
func nvmeSanitizeCdw10() uint32 { return 4 }

// nvmeSanitizeStatus decodes the sanitize log page's SSTAT (bits 2:0 of bytes 2–3).
func nvmeSanitizeStatus(log []byte) (done, failed bool, progress float64) {
	if len(log) < 4 {
		return false, true, 0
	}
	sstat := binary.LittleEndian.Uint16(log[2:]) & 0x7
	progress = float64(binary.LittleEndian.Uint16(log[0:])) / 65536
	switch sstat {
	case 1: // most recent sanitize completed successfully
		return true, false, 1
	case 3: // failed
		return false, true, progress
	}
	return false, false, progress // 0 never sanitized (not started yet), 2 in progress
}

func nvmeAdmin(fd int, c *nvmeAdminCmd, data []byte) error {
	if len(data) > 0 {
		c.Addr = uint64(uintptrOf(data))
		c.DataLen = uint32(len(data))
	}
	r, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), nvmeIoctlAdminCmd, uintptr(unsafe.Pointer(c)))
	if e != 0 {
		return ioctlErr(e)
	}
	if r != 0 { // NVMe status: SCT/SC; 0x1 invalid opcode, 0x2 invalid field
		sc := r & 0xff
		if sct := r >> 8 & 0x7; sct == 0 && (sc == 0x1 || sc == 0x2) {
			return fmt.Errorf("NVMe status %#x: %w", r, ErrNotSupported)
		}
		return fmt.Errorf("NVMe command %#x failed with status %#x", c.Opcode, r)
	}
	return nil
}

func nvmeIdentify(fd int) (nvmeIDInfo, error) {
	nsid, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), nvmeIoctlID, 0)
	if e != 0 {
		return nvmeIDInfo{}, fmt.Errorf("reading the namespace ID: %w", ioctlErr(e))
	}
	ctrl := AlignedBuffer(4096)
	if err := nvmeAdmin(fd, &nvmeAdminCmd{Opcode: nvmeOpIdentify, Cdw10: 1}, ctrl); err != nil {
		return nvmeIDInfo{}, fmt.Errorf("identify controller: %w", err)
	}
	ns := AlignedBuffer(4096)
	if err := nvmeAdmin(fd, &nvmeAdminCmd{Opcode: nvmeOpIdentify, NSID: uint32(nsid), Cdw10: 0}, ns); err != nil {
		return nvmeIDInfo{}, fmt.Errorf("identify namespace %d: %w", nsid, err)
	}
	return parseNVMeIdentify(ctrl, ns), nil
}

func nvmeFormatCrypto(ctx context.Context, fd int) (string, error) {
	id, err := nvmeIdentify(fd)
	if err != nil {
		return "", err
	}
	// All namespaces (0xffffffff): crypto erase destroys the controller-wide key on most drives.
	c := &nvmeAdminCmd{Opcode: nvmeOpFormat, NSID: 0xffffffff, Cdw10: nvmeFormatCdw10(id.lbaFormat), TimeoutMs: uint32((2 * time.Hour).Milliseconds())}
	if err := nvmeAdmin(fd, c, nil); err != nil {
		return "", err
	}
	return "nvme format (SES=2) completed", ctx.Err()
}

func nvmeSanitizeCrypto(ctx context.Context, fd int) (string, error) {
	if err := nvmeAdmin(fd, &nvmeAdminCmd{Opcode: nvmeOpSanitize, Cdw10: nvmeSanitizeCdw10()}, nil); err != nil {
		return "", err
	}
	log := AlignedBuffer(512)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		numd := uint32(len(log)/4 - 1)
		c := &nvmeAdminCmd{Opcode: nvmeOpGetLogPage, NSID: 0xffffffff, Cdw10: numd<<16 | nvmeLogSanitize}
		if err := nvmeAdmin(fd, c, log); err != nil {
			return "", fmt.Errorf("reading the sanitize log: %w", err)
		}
		done, failed, progress := nvmeSanitizeStatus(log)
		switch {
		case done:
			return "nvme sanitize log: completed successfully", nil
		case failed:
			return fmt.Sprintf("nvme sanitize log: failed at %.0f%%", progress*100), fmt.Errorf("the drive reports the sanitize failed")
		}
		select {
		case <-ctx.Done():
			// The drive keeps sanitizing after a power cycle; the command just stops waiting.
			return fmt.Sprintf("nvme sanitize in progress (%.0f%%)", progress*100), ctx.Err()
		case <-tick.C:
		}
	}
}
