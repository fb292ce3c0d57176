package ipmibmc

import (
	"errors"
	"fmt"
)

// Boot option parameter selectors this BMC implements (IPMI v2.0 §28.13, Table 28-14).
const (
	paramSetInProgress = 0x00
	paramValidBitClear = 0x03
	paramBootInfoAck   = 0x04
	paramBootFlags     = 0x05
)

// bootFlagsLen is the size of parameter 5's data.
const bootFlagsLen = 5

// Boot device selectors (byte 2, bits 5:2 of parameter 5) and the machine device each maps to.
// Selectors not in this table are refused: the VM cannot boot them, and accepting them would make
// the read-back lie.
var deviceBySelector = map[uint8]string{
	0x01: "pxe",  // force PXE
	0x02: "disk", // force boot from default hard drive
	0x05: "cd",   // force boot from default CD/DVD
}

// bootFlags is the decoded part of parameter 5 this BMC acts on; raw keeps every byte for read-back.
type bootFlags struct {
	Valid      bool
	Persistent bool
	EFI        bool
	Selector   uint8 // 0 = no override
	raw        [bootFlagsLen]byte
}

// Device returns the machine device the flags select ("" when they select none).
func (f bootFlags) Device() string { return deviceBySelector[f.Selector] }

var errTruncated = errors.New("request data truncated")

// decodeBootFlags parses parameter 5's data (at least 5 bytes; extra bytes are ignored as the
// spec allows).
func decodeBootFlags(data []byte) (bootFlags, error) {
	if len(data) < bootFlagsLen {
		return bootFlags{}, fmt.Errorf("boot flags: %d bytes, want %d: %w", len(data), bootFlagsLen, errTruncated)
	}
	var f bootFlags
	copy(f.raw[:], data[:bootFlagsLen])
	f.Valid = data[0]&0x80 != 0
	f.Persistent = data[0]&0x40 != 0
	f.EFI = data[0]&0x20 != 0
	f.Selector = (data[1] >> 2) & 0x0f
	return f, nil
}

// bootWrite is one decoded Set System Boot Options request.
type bootWrite struct {
	Selector     uint8
	MarkInvalid  bool // byte 1 bit 7: "mark parameter invalid / locked"
	Data         []byte
	Flags        bootFlags // when Selector == paramBootFlags and Data is not empty
	InProgress   uint8     // when Selector == paramSetInProgress
	ValidBitData uint8     // when Selector == paramValidBitClear
}

// parseSetBootOptions decodes the request data of Set System Boot Options (Chassis 08h).
// It is pure and fuzzed: the bytes come from the network.
func parseSetBootOptions(req []byte) (bootWrite, error) {
	if len(req) < 1 {
		return bootWrite{}, errTruncated
	}
	w := bootWrite{Selector: req[0] & 0x7f, MarkInvalid: req[0]&0x80 != 0, Data: req[1:]}
	if len(w.Data) == 0 {
		return w, nil // only the valid/lock bit: accepted, nothing stored
	}
	switch w.Selector {
	case paramSetInProgress:
		w.InProgress = w.Data[0] & 0x03
		if w.InProgress == 0x03 {
			return w, fmt.Errorf("set in progress: reserved value 3: %w", errInvalidField)
		}
	case paramValidBitClear:
		w.ValidBitData = w.Data[0] & 0x1f
	case paramBootInfoAck:
		if len(w.Data) < 2 {
			return w, errTruncated
		}
	case paramBootFlags:
		f, err := decodeBootFlags(w.Data)
		if err != nil {
			return w, err
		}
		if f.Valid && f.Selector != 0 && f.Device() == "" {
			return w, fmt.Errorf("boot device selector %#x: %w", f.Selector, errInvalidField)
		}
		w.Flags = f
	default:
		return w, errNotSupported
	}
	return w, nil
}

var (
	errInvalidField = errors.New("invalid data field")
	errNotSupported = errors.New("parameter not supported")
)
