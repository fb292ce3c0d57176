package cache

import (
	"crypto/sha256"
	"encoding/binary"
)

// Verified remembers checks that passed (signature verifications), by the SHA-256 of their
// inputs, each length-prefixed. A verification depends on its inputs alone, so what is
// remembered is never wrong: other inputs are another entry. Bounded as Bounded is; safe for
// concurrent use. A nil *Verified remembers nothing.
type Verified struct{ seen *Bounded[[32]byte, bool] }

// NewVerified returns an empty Verified remembering at most max checks.
func NewVerified(max int) *Verified { return &Verified{seen: New[[32]byte, bool](max)} }

// Check reports whether check passes for inputs: at once when it passed before for the same
// inputs, else check's answer, remembered when it passes (a failure is checked again).
func (v *Verified) Check(check func() bool, inputs ...[]byte) bool {
	if v == nil {
		return check()
	}
	h := sha256.New()
	var size [8]byte
	for _, in := range inputs {
		binary.BigEndian.PutUint64(size[:], uint64(len(in)))
		h.Write(size[:])
		h.Write(in)
	}
	var key [32]byte
	h.Sum(key[:0])
	if ok, _ := v.seen.Get(key); ok {
		return true
	}
	if !check() {
		return false
	}
	v.seen.Put(key, true)
	return true
}

// Len is how many passed checks are remembered.
func (v *Verified) Len() int { return v.seen.Len() }
