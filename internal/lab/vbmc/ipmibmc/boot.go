package ipmibmc

import (
	"context"
	"errors"
	"sync"

	"github.com/bougou/go-ipmi/pkg/handlers"
	"github.com/bougou/go-ipmi/pkg/types"
)

// bootState is what Get System Boot Options reads back.
type bootState struct {
	inProgress    uint8
	validBitClear uint8
	ack           [2]byte
	flags         bootFlags
}

type bootStore struct {
	mu     sync.Mutex
	ignore bool
	st     bootState
}

func (s *bootStore) setIgnore(on bool) {
	s.mu.Lock()
	s.ignore = on
	s.mu.Unlock()
}

func (s *bootStore) ignoring() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ignore
}

func (s *bootStore) get() bootState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

func (s *bootStore) update(fn func(*bootState)) {
	s.mu.Lock()
	fn(&s.st)
	s.mu.Unlock()
}

// consumeOneTime clears the valid bit of a next-boot-only override once the machine boots, as a
// BIOS does on real hardware.
func (s *bootStore) consumeOneTime() {
	s.update(func(st *bootState) {
		if st.flags.Valid && !st.flags.Persistent {
			st.flags.Valid = false
			st.flags.raw[0] &^= 0x80
		}
	})
}

// bootCode maps a parse error to the completion code the spec asks for.
func bootCode(err error) types.CompletionCode {
	switch {
	case err == nil:
		return types.CodeOK
	case errors.Is(err, errTruncated):
		return types.CodeRequestDataTruncated
	case errors.Is(err, errNotSupported):
		return types.CodeParameterNotSupported
	case errors.Is(err, errInvalidField):
		return types.CodeRequestDataFieldInvalid
	}
	return types.CodeUnspecifiedError
}

// handleSetBootOptions implements Set System Boot Options (Chassis 08h) for parameters 0, 3, 4, 5.
func (b *BMC) handleSetBootOptions(ctx context.Context, _ *handlers.HandlerContext, req []byte) ([]byte, types.CompletionCode, error) {
	w, err := parseSetBootOptions(req)
	if err != nil {
		b.log.Warn("Set System Boot Options refused", "err", err)
		return nil, bootCode(err), nil
	}
	return nil, b.applyBootWrite(ctx, w), nil
}

// codeSetInProgressActive is 81h: "attempt to set 'set in progress' when not in 'set complete'".
const codeSetInProgressActive types.CompletionCode = 0x81

func (b *BMC) applyBootWrite(ctx context.Context, w bootWrite) types.CompletionCode {
	if len(w.Data) == 0 {
		return types.CodeOK
	}
	if b.boot.ignoring() {
		b.log.Warn("Set System Boot Options accepted and ignored (test hook)", "param", w.Selector)
		return types.CodeOK
	}
	switch w.Selector {
	case paramSetInProgress:
		cc := types.CodeOK
		b.boot.update(func(st *bootState) {
			if w.InProgress == 1 && st.inProgress == 1 {
				cc = codeSetInProgressActive
				return
			}
			st.inProgress = w.InProgress
			if w.InProgress == 2 { // commit write: nothing is staged, back to complete
				st.inProgress = 0
			}
		})
		return cc
	case paramValidBitClear:
		b.boot.update(func(st *bootState) { st.validBitClear = w.ValidBitData })
	case paramBootInfoAck:
		// Byte 1 is a write mask for byte 2 (Table 28-14 #4).
		b.boot.update(func(st *bootState) {
			st.ack[1] = (st.ack[1] &^ w.Data[0]) | (w.Data[1] & w.Data[0])
		})
	case paramBootFlags:
		f := w.Flags
		if dev := f.Device(); f.Valid && dev != "" {
			mctx, cancel := context.WithTimeout(ctx, machineCallTimeout)
			err := b.m.SetBootDevice(mctx, dev)
			cancel()
			if err != nil {
				b.log.Error("setting machine boot device", "device", dev, "err", err)
				return types.CodeUnspecifiedError
			}
		}
		b.boot.update(func(st *bootState) { st.flags = f })
		b.log.Info("boot flags set", "valid", f.Valid, "device", f.Device(), "persistent", f.Persistent, "efi", f.EFI)
	}
	return types.CodeOK
}

// handleGetBootOptions implements Get System Boot Options (Chassis 09h).
func (b *BMC) handleGetBootOptions(_ context.Context, _ *handlers.HandlerContext, req []byte) ([]byte, types.CompletionCode, error) {
	if len(req) < 1 {
		return nil, types.CodeRequestDataTruncated, nil
	}
	sel := req[0] & 0x7f
	st := b.boot.get()
	var data []byte
	switch sel {
	case paramSetInProgress:
		data = []byte{st.inProgress}
	case paramValidBitClear:
		data = []byte{st.validBitClear}
	case paramBootInfoAck:
		data = st.ack[:]
	case paramBootFlags:
		data = st.flags.raw[:]
	default:
		return nil, types.CodeParameterNotSupported, nil
	}
	// Byte 1: parameter version 1; byte 2: [7] valid/unlocked (0), [6:0] selector.
	return append([]byte{0x01, sel}, data...), types.CodeOK, nil
}
