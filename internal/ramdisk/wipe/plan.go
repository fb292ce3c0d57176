// Package wipe erases disks for the ramdisk's disk.wipe command and proves it by reading back.
//
// Modes (DESIGN §8):
//   - quick: partition tables and signatures: the first and last MiB of the disk (MBR, both GPT
//     headers and tables, mdraid/ZFS labels at the end), the head and tail MiB of every partition
//     found in the MBR (logical ones included), the primary GPT or the backup GPT before wiping,
//     the MiB before a backup GPT the primary names away from the disk's end (a disk that
//     grew), and btrfs's superblock mirrors at 64 MiB and 256 GiB (of the disk and of every
//     partition).
//   - full: every byte: BLKZEROOUT when the device offloads it, else large aligned (O_DIRECT) writes.
//   - secure: NVMe sanitize (crypto erase), NVMe format with crypto erase, ATA SECURITY ERASE UNIT
//     (only when not frozen), BLKSECDISCARD, BLKDISCARD where discarded blocks read as zeros,
//     BLKZEROOUT, then writing zeros, in that order of preference. A method that erases by
//     destroying the key (or whose result is unspecified) is followed by a zero fill unless the
//     device guarantees zeros afterwards, so the read-back check is the same for every method.
//
// Which methods are tried is the pure function Plan over the device's Capabilities; a method falls
// through to the next only on ErrNotSupported, and every attempt is recorded in the Result. After
// the erase every device is flushed, the host's cache of it dropped (CacheDropper), and read back
// from the device: quick → every region it zeroed; full/secure → head, tail and N seeded random
// samples, plus the device's own erase status where it reports one.
//
// The package fails closed: a device that cannot be opened or whose capabilities cannot be read
// fails the command, and a read-back that finds a non-zero byte fails it too. So does capacity
// the kernel does not show (an ATA host protected area, NVMe namespaces without a block device,
// unallocated NVMe capacity: hidden.go): the disk is erased as far as the kernel shows it, and
// its Result fails saying what is hidden and what to do.
package wipe

import "fmt"

// Mode is what the caller asked for.
type Mode string

// Modes.
const (
	ModeQuick  Mode = "quick"
	ModeFull   Mode = "full"
	ModeSecure Mode = "secure"
)

// ParseMode validates a mode from a command.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeQuick, ModeFull, ModeSecure:
		return m, nil
	}
	return "", fmt.Errorf("unknown wipe mode %q (want quick, full or secure)", s)
}

// Method is one way of erasing.
type Method string

// Methods, in the order secure mode prefers them.
const (
	MethodNVMeSanitizeCrypto Method = "nvme-sanitize-crypto-erase"
	MethodNVMeFormatCrypto   Method = "nvme-format-crypto-erase"
	MethodATASecureErase     Method = "ata-security-erase-enhanced"
	MethodATASecureEraseStd  Method = "ata-security-erase"
	MethodSecDiscard         Method = "blksecdiscard"
	MethodDiscard            Method = "blkdiscard"
	MethodZeroOut            Method = "blkzeroout"
	MethodWriteZeros         Method = "write-zeros"
	MethodQuickZero          Method = "write-zeros-signatures"
)

// Offloaded reports whether the device (not the host) does the erase.
func (m Method) Offloaded() bool {
	return m != MethodWriteZeros && m != MethodQuickZero
}

// Error is a constant error value of this package.
type Error string

func (e Error) Error() string { return string(e) }

// ErrNotSupported is returned (wrapped) by an Offloader for a method the device cannot do. Only
// this error makes Wipe try the next method.
const ErrNotSupported = Error("erase method not supported by the device")

// Capabilities is what a device says it can do. The zero value (a plain file) can only be
// written.
type Capabilities struct {
	NVMe                bool `json:"nvme"`
	NVMeSanitizeCrypto  bool `json:"nvmeSanitizeCrypto"` // SANICAP bit 0
	NVMeFormatCrypto    bool `json:"nvmeFormatCrypto"`   // FNA bit 2
	ATASecurity         bool `json:"ataSecurity"`        // IDENTIFY word 128 bit 0
	ATAFrozen           bool `json:"ataFrozen"`          // word 128 bit 3
	ATAEnhancedErase    bool `json:"ataEnhancedErase"`   // word 128 bit 5
	SecDiscard          bool `json:"secDiscard"`
	Discard             bool `json:"discard"`
	DiscardZeroes       bool `json:"discardZeroes"`       // discarded blocks read back as zeros
	ZeroOut             bool `json:"zeroOut"`             // BLKZEROOUT works (the kernel may emulate it)
	ZeroOutOffload      bool `json:"zeroOutOffload"`      // write_zeroes_max_bytes > 0: the device does it
	ReadsZeroAfterErase bool `json:"readsZeroAfterErase"` // e.g. NVMe DLFEAT = 001b
}

// Plan is the ordered list of methods to try for mode on a device with caps. The last entry is
// always a host-side write, which every writable device supports.
func Plan(mode Mode, c Capabilities) []Method {
	switch mode {
	case ModeQuick:
		return []Method{MethodQuickZero}
	case ModeFull:
		if c.ZeroOut && c.ZeroOutOffload {
			return []Method{MethodZeroOut, MethodWriteZeros}
		}
		return []Method{MethodWriteZeros}
	case ModeSecure:
		var p []Method
		if c.NVMe && c.NVMeSanitizeCrypto {
			p = append(p, MethodNVMeSanitizeCrypto)
		}
		if c.NVMe && c.NVMeFormatCrypto {
			p = append(p, MethodNVMeFormatCrypto)
		}
		if c.ATASecurity && !c.ATAFrozen {
			if c.ATAEnhancedErase {
				p = append(p, MethodATASecureErase)
			}
			p = append(p, MethodATASecureEraseStd)
		}
		if c.SecDiscard {
			p = append(p, MethodSecDiscard)
		}
		if c.Discard && c.DiscardZeroes {
			p = append(p, MethodDiscard)
		}
		if c.ZeroOut {
			p = append(p, MethodZeroOut)
		}
		return append(p, MethodWriteZeros)
	}
	return nil
}

// NeedsZeroFill reports whether, after m succeeded, the device must still be zeroed for the
// read-back to be meaningful: crypto and security erases leave unspecified data unless the
// device guarantees zeros.
func NeedsZeroFill(m Method, c Capabilities) bool {
	switch m {
	case MethodNVMeSanitizeCrypto, MethodNVMeFormatCrypto, MethodATASecureErase, MethodATASecureEraseStd, MethodSecDiscard:
		return !c.ReadsZeroAfterErase
	}
	return false
}

// ZeroFillPlan is the plan for the zero fill that follows an erase which leaves unspecified data.
func ZeroFillPlan(c Capabilities) []Method {
	if c.ZeroOut {
		return []Method{MethodZeroOut, MethodWriteZeros}
	}
	return []Method{MethodWriteZeros}
}
