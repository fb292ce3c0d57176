// Package osimage builds the lab OS image: a small raw disk that SeaBIOS, OVMF and the
// ramdisk's kexec step all boot, holding a "installed OS" that is the static bcd binary in OS
// mode (bcd.role=os: DHCP, fetch the node's metadata, rejoin the control plane as the node).
//
// Disk layout (all sizes fixed by the inputs, so the same inputs give the same bytes):
//
//	LBA 0              syslinux's mbr.bin (440 bytes), fixed disk signature, one MBR partition
//	LBA 2048 (1 MiB)   partition 1: active, type 0xEF (EFI system partition), FAT16 "BCDOS",
//	                   volume id fixed, hidden sectors 2048, every timestamp DOS epoch + fixed
//	  /vmlinuz                      Debian's kernel (the ramdisk's)
//	  /initrd.img                   initramfs: /init = bcd (PID 1), modules + load order
//	  /syslinux/syslinux.cfg        the one boot configuration (BIOS and EFI syslinux, kexec)
//	  /syslinux/ldlinux.sys,.c32    syslinux for BIOS (syslinux --install --directory /syslinux)
//	  /EFI/BOOT/BOOTX64.EFI         syslinux.efi (the removable-media path OVMF boots)
//	  /EFI/BOOT/ldlinux.e64         its core module
//	  /bcd-os.json                  marker: the OS agent keeps its identity on this partition
//
// The OS agent writes its identity under /bcd-state on the same partition at run time.
package osimage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"bcd/internal/osagent"
)

// Geometry and identity constants of the image.
const (
	SectorSize      = 512
	PartitionStart  = 2048 // LBA of partition 1 (1 MiB)
	DiskSignature   = 0xb0cd0051
	VolumeID        = 0xb0cd0001
	VolumeLabel     = "BCDOS"
	TypeESP         = 0xEF
	TypeFAT32LBA    = 0x0C
	mbrBootCodeSize = 440
)

// Paths inside the FAT partition (no leading slash).
const (
	KernelPath     = "vmlinuz"
	InitrdPath     = "initrd.img"
	SyslinuxDir    = "syslinux"
	ConfigPath     = "syslinux/syslinux.cfg"
	EFIDir         = "EFI/BOOT"
	EFIBootPath    = "EFI/BOOT/BOOTX64.EFI"
	EFILdlinuxPath = "EFI/BOOT/ldlinux.e64"
	MarkerPath     = osagent.MarkerFile
	StateDir       = osagent.StateDir
)

// BaseCmdline is what every boot of the image passes to the kernel: the serial console (the lab
// logs it), OS mode, and no_timer_check — the image only ever runs in TCG-emulated VMs, where a
// loaded host delays the vCPU enough that the kernel's IO-APIC timer check fails and it panics
// ("IO-APIC + timer doesn't work!"; seen after kexec with the host at load 10). Cloud images for
// VMs pass it for the same reason.
const BaseCmdline = "console=tty0 console=ttyS0,115200 no_timer_check bcd.role=os"

// SyslinuxConfig is the syslinux.cfg both loaders (and kexec) read: one entry, no prompt, output
// on the serial port too. extra is appended to the kernel command line.
func SyslinuxConfig(extra string) string {
	cmdline := BaseCmdline
	if extra = strings.TrimSpace(extra); extra != "" {
		cmdline += " " + extra
	}
	return "# bcd lab OS image: one entry, read by BIOS and EFI syslinux and by the ramdisk's kexec.\n" +
		"SERIAL 0 115200\n" +
		"DEFAULT bcd-os\n" +
		"PROMPT 0\n" +
		"TIMEOUT 0\n" +
		"LABEL bcd-os\n" +
		"  MENU LABEL bcd lab OS\n" +
		"  LINUX /" + KernelPath + "\n" +
		"  INITRD /" + InitrdPath + "\n" +
		"  APPEND " + cmdline + "\n"
}

// Partition is one MBR partition entry.
type Partition struct {
	Active   bool
	Type     byte
	StartLBA uint32
	Sectors  uint32
}

// MBR returns the first sector: bootCode (at most 440 bytes: syslinux's mbr.bin), the disk
// signature, one partition entry and the 0x55AA signature. CHS fields hold the "use LBA"
// values (0xFE 0xFF 0xFF) that every firmware accepts for LBA-addressed partitions.
func MBR(bootCode []byte, p Partition) ([]byte, error) {
	if len(bootCode) > mbrBootCodeSize {
		return nil, fmt.Errorf("MBR boot code of %d bytes: at most %d fit", len(bootCode), mbrBootCodeSize)
	}
	if p.StartLBA == 0 || p.Sectors == 0 {
		return nil, errors.New("MBR partition needs a start and a size")
	}
	if p.Type == 0 || p.Type == 0x05 || p.Type == 0x0F || p.Type == 0xEE {
		return nil, fmt.Errorf("MBR partition type %#02x: use a data partition type (e.g. 0xEF or 0x0C)", p.Type)
	}
	s := make([]byte, SectorSize)
	copy(s, bootCode)
	binary.LittleEndian.PutUint32(s[440:], DiskSignature)
	e := s[446:462]
	if p.Active {
		e[0] = 0x80
	}
	copy(e[1:4], []byte{0xFE, 0xFF, 0xFF})
	e[4] = p.Type
	copy(e[5:8], []byte{0xFE, 0xFF, 0xFF})
	binary.LittleEndian.PutUint32(e[8:], p.StartLBA)
	binary.LittleEndian.PutUint32(e[12:], p.Sectors)
	s[510], s[511] = 0x55, 0xAA
	return s, nil
}

// ParseMBR reads the four primary partition entries of a first sector (empty ones skipped).
func ParseMBR(sector []byte) ([]Partition, error) {
	if len(sector) < SectorSize || sector[510] != 0x55 || sector[511] != 0xAA {
		return nil, errors.New("no MBR signature (0x55AA) in the first sector")
	}
	var out []Partition
	for i := range 4 {
		e := sector[446+16*i : 446+16*(i+1)]
		if e[4] == 0 {
			continue
		}
		out = append(out, Partition{Active: e[0] == 0x80, Type: e[4],
			StartLBA: binary.LittleEndian.Uint32(e[8:]), Sectors: binary.LittleEndian.Uint32(e[12:])})
	}
	return out, nil
}

// PartitionMiB sizes the FAT partition for payload bytes of files: the payload with a quarter
// more for FAT overhead and the OS agent's state, at least 32 MiB (FAT16 with 2 KiB clusters),
// rounded up to whole MiB.
func PartitionMiB(payload int64) int64 {
	const mib = 1 << 20
	need := payload + payload/4 + 4*mib
	return max(32, (need+mib-1)/mib)
}
