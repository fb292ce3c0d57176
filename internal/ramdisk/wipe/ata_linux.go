package wipe

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sgIOHdr is struct sg_io_hdr from <scsi/sg.h> (88 bytes on 64-bit).
type sgIOHdr struct {
	InterfaceID    int32
	DxferDirection int32
	CmdLen         uint8
	MxSbLen        uint8
	IovecCount     uint16
	DxferLen       uint32
	Dxferp         unsafe.Pointer
	Cmdp           unsafe.Pointer
	Sbp            unsafe.Pointer
	Timeout        uint32
	Flags          uint32
	PackID         int32
	UsrPtr         unsafe.Pointer
	Status         uint8
	MaskedStatus   uint8
	MsgStatus      uint8
	SbLenWr        uint8
	HostStatus     uint16
	DriverStatus   uint16
	Resid          int32
	Duration       uint32
	Info           uint32
}

const (
	sgIO          = 0x2285
	sgDxferNone   = -1
	sgDxferToDev  = -2
	sgDxferFromDv = -3

	ataIdentify          = 0xec
	ataSecuritySetPass   = 0xf1
	ataSecurityErasePrep = 0xf3
	ataSecurityEraseUnit = 0xf4
	ataSecurityDisable   = 0xf6

	ataProtoNonData = 3
	ataProtoPIOIn   = 4
	ataProtoPIOOut  = 5
)

// ataPassThrough16 builds an ATA PASS-THROUGH (16) CDB (SAT-3) for a 28-bit command with one
// 512-byte sector of data (or none).
func ataPassThrough16(cmd uint8, proto uint8) [16]byte {
	var cdb [16]byte
	cdb[0] = 0x85
	cdb[1] = proto << 1
	switch proto {
	case ataProtoPIOIn:
		cdb[2] = 0x0e // T_DIR=1 (from device), BYT_BLOK=1, T_LENGTH=2 (sector count)
	case ataProtoPIOOut:
		cdb[2] = 0x06 // T_DIR=0, BYT_BLOK=1, T_LENGTH=2
	default:
		cdb[2] = 0x20 // CK_COND: return the ATA registers
	}
	if proto != ataProtoNonData {
		cdb[6] = 1 // sector count
	}
	cdb[13] = 0x40 // device: LBA mode
	cdb[14] = cmd
	return cdb
}

// ataSecurity is IDENTIFY DEVICE word 128.
type ataSecurity struct {
	supported, enabled, locked, frozen, enhanced bool
	eraseMinutes                                 int // word 89 (enhanced: word 90), 0 = unknown
	enhancedMinutes                              int
}

func parseATAIdentify(id []byte) ataSecurity {
	if len(id) < 512 {
		return ataSecurity{}
	}
	w := func(i int) uint16 { return binary.LittleEndian.Uint16(id[2*i:]) }
	w128 := w(128)
	minutes := func(v uint16) int {
		v &= 0x7fff // extended format bit 15 ignored: both formats count 2-minute units
		if v == 0 {
			return 0
		}
		return int(v) * 2
	}
	return ataSecurity{
		supported:       w128&(1<<0) != 0,
		enabled:         w128&(1<<1) != 0,
		locked:          w128&(1<<2) != 0,
		frozen:          w128&(1<<3) != 0,
		enhanced:        w128&(1<<5) != 0,
		eraseMinutes:    minutes(w(89)),
		enhancedMinutes: minutes(w(90)),
	}
}

// ataPasswordBlock is the 512-byte data sector for SECURITY SET PASSWORD / ERASE UNIT: word 0
// control (bit 0 master, bit 1 enhanced erase), words 1–16 the password.
func ataPasswordBlock(password string, enhanced bool) []byte {
	b := AlignedBuffer(512)
	if enhanced {
		b[0] = 1 << 1
	}
	copy(b[2:34], password)
	return b
}

func sgATA(fd int, cmd, proto uint8, data []byte, timeout time.Duration) error {
	return sgATACDB(fd, ataPassThrough16(cmd, proto), proto, data, timeout)
}

// sgATACDB sends an ATA PASS-THROUGH (16) CDB (command in byte 14) moving data per proto.
func sgATACDB(fd int, cdb [16]byte, proto uint8, data []byte, timeout time.Duration) error {
	cmd := cdb[14]
	sense := make([]byte, 32)
	h := sgIOHdr{
		InterfaceID: 'S', CmdLen: uint8(len(cdb)), MxSbLen: uint8(len(sense)),
		Cmdp: unsafe.Pointer(&cdb[0]), Sbp: unsafe.Pointer(&sense[0]), Timeout: uint32(timeout.Milliseconds()),
	}
	switch proto {
	case ataProtoPIOIn:
		h.DxferDirection = sgDxferFromDv
	case ataProtoPIOOut:
		h.DxferDirection = sgDxferToDev
	default:
		h.DxferDirection = sgDxferNone
	}
	if len(data) > 0 {
		h.Dxferp, h.DxferLen = unsafe.Pointer(&data[0]), uint32(len(data))
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), sgIO, uintptr(unsafe.Pointer(&h))); e != 0 {
		return ioctlErr(e)
	}
	// An ATA error comes back as CHECK CONDITION with ATA status in the descriptor sense data;
	// ABRT (error bit 2) means the drive refused the command: not supported in this state.
	if h.Status != 0 || h.HostStatus != 0 || (h.DriverStatus&0xf) != 0 {
		if h.SbLenWr >= 22 && sense[8] == 0x09 { // ATA status return descriptor
			ataErr, ataStatus := sense[11], sense[21]
			if ataStatus&0x01 == 0 { // ERR clear: CK_COND's informational sense
				return nil
			}
			if ataErr&0x04 != 0 {
				return fmt.Errorf("ATA command %#x aborted: %w", cmd, ErrNotSupported)
			}
			return fmt.Errorf("ATA command %#x failed: status %#x error %#x", cmd, ataStatus, ataErr)
		}
		return fmt.Errorf("ATA command %#x via SG_IO failed: scsi %#x host %#x driver %#x", cmd, h.Status, h.HostStatus, h.DriverStatus)
	}
	return nil
}

func ataIdentifySecurity(fd int) (ataSecurity, error) {
	id := AlignedBuffer(512)
	if err := sgATA(fd, ataIdentify, ataProtoPIOIn, id, 10*time.Second); err != nil {
		return ataSecurity{}, err
	}
	return parseATAIdentify(id), nil
}

// ataSecureErase sets a temporary user password, then SECURITY ERASE PREPARE + ERASE UNIT. The
// drive clears the password when the erase completes.
func ataSecureErase(ctx context.Context, fd int, enhanced bool) (string, error) {
	sec, err := ataIdentifySecurity(fd)
	if err != nil {
		return "", err
	}
	switch {
	case !sec.supported:
		return "", fmt.Errorf("security feature set absent: %w", ErrNotSupported)
	case sec.frozen:
		return "", fmt.Errorf("security frozen by the firmware: %w", ErrNotSupported)
	case sec.locked:
		return "", fmt.Errorf("drive is security-locked with an unknown password: %w", ErrNotSupported)
	case enhanced && !sec.enhanced:
		return "", fmt.Errorf("enhanced erase: %w", ErrNotSupported)
	}
	const password = "bcd-wipe"
	if err := sgATA(fd, ataSecuritySetPass, ataProtoPIOOut, ataPasswordBlock(password, false), 30*time.Second); err != nil {
		return "", fmt.Errorf("setting the temporary password: %w", err)
	}
	if err := sgATA(fd, ataSecurityErasePrep, ataProtoNonData, nil, 30*time.Second); err != nil {
		return "", fmt.Errorf("erase prepare: %w", err)
	}
	minutes := sec.eraseMinutes
	if enhanced {
		minutes = sec.enhancedMinutes
	}
	timeout := time.Duration(max(minutes, 60)) * 2 * time.Minute
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	if err := sgATA(fd, ataSecurityEraseUnit, ataProtoPIOOut, ataPasswordBlock(password, enhanced), timeout); err != nil {
		return "", fmt.Errorf("erase unit (the temporary password %q may still be set): %w", password, err)
	}
	after, err := ataIdentifySecurity(fd)
	if err != nil {
		return "", fmt.Errorf("identify after erase: %w", err)
	}
	if after.enabled {
		return "ata security: still enabled after erase", fmt.Errorf("the drive still has security enabled after ERASE UNIT")
	}
	return fmt.Sprintf("ata security erase unit completed (enhanced=%v), security disabled", enhanced), nil
}
