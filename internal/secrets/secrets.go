// Package secrets seals secret values (BMC credentials, the agent CA's keys) with AES-256-GCM
// under a keyring kept outside the database. Only a secret:// reference to the sealed row is
// ever stored next to the thing that uses it.
//
// A sealed value is
//
//	"BCD\x01" || key id (8 bytes) || nonce (12) || ciphertext || tag (16)
//
// sealed with additional data "BCD\x01" || key id || the row's id: the header names the key
// (KeyID, derived from the key itself) and is authenticated with the row. Values sealed before
// keyrings (legacy: nonce || ciphertext || tag, additional data the row's id) still open: the
// installation's original key is in the keyring until `bcd secrets rotate-key` re-sealed them.
//
// A legacy value's random nonce starts with the 4-byte magic once in 2^32 values, so the magic
// alone does not tell the formats apart. The authentication does: Open tries the keyed format
// when the magic is there, and the legacy one when that fails. A keyed value does not open as
// legacy (its tag covers the header, which the legacy reading takes for a nonce), a legacy one
// does not open as keyed (the header is not in its additional data); either would be a GCM
// forgery. For the same reason a value whose key id was changed, or stripped, opens under no
// reading.
package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// KeySize is the size of a sealing key (AES-256).
const KeySize = 32

// RefPrefix starts every secret reference.
const RefPrefix = "secret://"

// Magic starts every value sealed under a keyring: "BCD" and the format's version.
const Magic = "BCD\x01"

// KeyIDSize is the size of a key id in a sealed value (shown as 16 hex digits).
const KeyIDSize = 8

// headerSize is the size of a keyed value's header: the magic and the key id.
const headerSize = len(Magic) + KeyIDSize

// Sealer seals values under the first key of its keyring and opens values sealed under any of
// its keys, or before keyrings (legacy) under the key that sealed them. The id of the secret is
// authenticated as additional data, so a sealed value cannot be moved to another row.
type Sealer struct {
	keys []sealKey // keys[0] seals
}

// sealKey is one key of a Sealer.
type sealKey struct {
	id   [KeyIDSize]byte
	aead cipher.AEAD
}

// NewSealer builds a Sealer from one 32-byte key.
func NewSealer(key []byte) (*Sealer, error) {
	r, err := NewKeyring(key)
	if err != nil {
		return nil, err
	}
	return NewKeyringSealer(r)
}

// NewKeyringSealer builds a Sealer from a keyring: its first key seals, every key opens.
func NewKeyringSealer(r Keyring) (*Sealer, error) {
	if len(r.keys) == 0 {
		return nil, errors.New("building a sealer: the keyring holds no key")
	}
	s := &Sealer{}
	for _, key := range r.keys {
		block, err := aes.NewCipher(key)
		if err != nil {
			return nil, fmt.Errorf("creating AES cipher: %w", err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("creating GCM: %w", err)
		}
		s.keys = append(s.keys, sealKey{id: keyID(key), aead: aead})
	}
	return s, nil
}

// errNoID refuses an empty id: a value sealed for it would be bound to no row.
var errNoID = errors.New("sealing a secret: the id of its row is required")

// Seal encrypts plaintext for the secret id under the sealing key (the keyring's first).
func (s *Sealer) Seal(id string, plaintext []byte) ([]byte, error) {
	if id == "" {
		return nil, errNoID
	}
	k := s.keys[0]
	ns := k.aead.NonceSize()
	out := make([]byte, headerSize+ns, headerSize+ns+len(plaintext)+k.aead.Overhead())
	copy(out, Magic)
	copy(out[len(Magic):], k.id[:])
	nonce := out[headerSize:]
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("reading nonce: %w", err)
	}
	return k.aead.Seal(out, nonce, plaintext, additionalData(out[:headerSize], id)), nil
}

// ErrTampered is returned when a sealed value does not open with this keyring and id. A value
// naming a key the keyring does not hold is ErrTampered too, and ErrKeyMissing.
var ErrTampered = errors.New("sealed secret does not open: wrong key, wrong id or altered")

// ErrKeyMissing: the sealed value names a key the keyring does not hold (KeyMissingError).
var ErrKeyMissing = errors.New("sealed under a key the keyring does not hold")

// KeyMissingError is the error of a value sealed under a key the keyring does not hold (or
// whose key id was altered).
type KeyMissingError struct {
	KeyID string // as KeyIDOf shows it
}

func (e *KeyMissingError) Error() string {
	return fmt.Sprintf("sealed secret does not open: it names sealing key %s, which the keyring does not hold (or it was altered)", e.KeyID)
}

// Is makes a KeyMissingError both ErrKeyMissing and ErrTampered (it does not open).
func (e *KeyMissingError) Is(target error) bool {
	return target == ErrKeyMissing || target == ErrTampered
}

// Open decrypts a value sealed for id, under any key of the keyring, keyed or legacy.
func (s *Sealer) Open(id string, sealed []byte) ([]byte, error) {
	if id == "" {
		return nil, ErrTampered
	}
	kid, keyed := headerKeyID(sealed)
	held := false
	if keyed {
		if k, ok := s.key(kid); ok {
			held = true
			if out, err := k.openKeyed(id, sealed); err == nil {
				return out, nil
			}
		}
	}
	// Legacy, or a legacy value whose nonce starts with the magic.
	for _, k := range s.keys {
		if out, err := k.openLegacy(id, sealed); err == nil {
			return out, nil
		}
	}
	if keyed && !held {
		return nil, &KeyMissingError{KeyID: hex.EncodeToString(kid[:])}
	}
	return nil, ErrTampered
}

// Reseal returns sealed (a value of the secret id) sealed under the sealing key: changed is
// false, and sealed returned as it is, when it already opens under that key. The plaintext
// does not leave the Sealer.
func (s *Sealer) Reseal(id string, sealed []byte) (resealed []byte, changed bool, err error) {
	if id == "" {
		return nil, false, ErrTampered
	}
	if kid, keyed := headerKeyID(sealed); keyed && kid == s.keys[0].id {
		if _, err := s.keys[0].openKeyed(id, sealed); err == nil {
			return sealed, false, nil
		}
	}
	plain, err := s.Open(id, sealed)
	if err != nil {
		return nil, false, err
	}
	defer clear(plain)
	out, err := s.Seal(id, plain)
	if err != nil {
		return nil, false, err
	}
	return out, true, nil
}

// SealingKeyID is the id of the key Seal seals under.
func (s *Sealer) SealingKeyID() string { return hex.EncodeToString(s.keys[0].id[:]) }

// Holds says whether the keyring holds the key a keyed value names; legacy is true, and held
// false, for a value without a key id (sealed before keyrings, or by chance looking so).
func (s *Sealer) Holds(sealed []byte) (held, legacy bool) {
	kid, keyed := headerKeyID(sealed)
	if !keyed {
		return false, true
	}
	_, ok := s.key(kid)
	return ok, false
}

func (s *Sealer) key(id [KeyIDSize]byte) (sealKey, bool) {
	for _, k := range s.keys {
		if k.id == id {
			return k, true
		}
	}
	return sealKey{}, false
}

func (k sealKey) openKeyed(id string, sealed []byte) ([]byte, error) {
	ns := k.aead.NonceSize()
	if len(sealed) < headerSize+ns+k.aead.Overhead() {
		return nil, ErrTampered
	}
	out, err := k.aead.Open(nil, sealed[headerSize:headerSize+ns], sealed[headerSize+ns:], additionalData(sealed[:headerSize], id))
	if err != nil {
		return nil, ErrTampered
	}
	return out, nil
}

func (k sealKey) openLegacy(id string, sealed []byte) ([]byte, error) {
	ns := k.aead.NonceSize()
	if len(sealed) < ns+k.aead.Overhead() {
		return nil, ErrTampered
	}
	out, err := k.aead.Open(nil, sealed[:ns], sealed[ns:], []byte(id))
	if err != nil {
		return nil, ErrTampered
	}
	return out, nil
}

// additionalData binds a keyed value to its header and its row: the header has a fixed size,
// so header || id is unambiguous.
func additionalData(header []byte, id string) []byte {
	return append(append(make([]byte, 0, len(header)+len(id)), header...), id...)
}

// headerKeyID returns the key id of a keyed value; keyed is false for a value too short to be
// one or without the magic (legacy).
func headerKeyID(sealed []byte) (id [KeyIDSize]byte, keyed bool) {
	if len(sealed) < headerSize || string(sealed[:len(Magic)]) != Magic {
		return id, false
	}
	copy(id[:], sealed[len(Magic):headerSize])
	return id, true
}

// KeyIDOf returns the key id a sealed value names ("" for a legacy value).
func KeyIDOf(sealed []byte) string {
	kid, keyed := headerKeyID(sealed)
	if !keyed {
		return ""
	}
	return hex.EncodeToString(kid[:])
}

// Ref returns the reference of secret id.
func Ref(id string) string { return RefPrefix + id }

// ParseRef returns the id of a secret reference.
func ParseRef(ref string) (string, error) {
	id, ok := strings.CutPrefix(ref, RefPrefix)
	if !ok || id == "" {
		return "", fmt.Errorf("invalid secret reference %q: expected %s<id>", ref, RefPrefix)
	}
	return id, nil
}
