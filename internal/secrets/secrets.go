// Package secrets seals secret values (BMC credentials, later rotation passwords) with
// AES-256-GCM under a key kept outside the database. Only a secret:// reference to the sealed
// row is ever stored next to the thing that uses it.
package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"bcd/internal/durable"
)

// KeySize is the size of the sealing key (AES-256).
const KeySize = 32

// RefPrefix starts every secret reference.
const RefPrefix = "secret://"

// Sealer seals and opens values with one key. The id of the secret is authenticated as
// additional data, so a sealed value cannot be moved to another row.
type Sealer struct {
	aead cipher.AEAD
}

// NewSealer builds a Sealer from a 32-byte key.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("sealing key must be %d bytes, got %d", KeySize, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("creating AES cipher: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("creating GCM: %w", err)
	}
	return &Sealer{aead: aead}, nil
}

// errNoID refuses an empty id: a value sealed for it would be bound to no row.
var errNoID = errors.New("sealing a secret: the id of its row is required")

// Seal encrypts plaintext for the secret id: nonce || ciphertext+tag.
func (s *Sealer) Seal(id string, plaintext []byte) ([]byte, error) {
	if id == "" {
		return nil, errNoID
	}
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plaintext)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("reading nonce: %w", err)
	}
	return s.aead.Seal(nonce, nonce, plaintext, []byte(id)), nil
}

// ErrTampered is returned when a sealed value does not open with this key and id.
var ErrTampered = errors.New("sealed secret does not open: wrong key, wrong id or altered")

// Open decrypts a value sealed for id.
func (s *Sealer) Open(id string, sealed []byte) ([]byte, error) {
	ns := s.aead.NonceSize()
	if id == "" || len(sealed) < ns+s.aead.Overhead() {
		return nil, ErrTampered
	}
	out, err := s.aead.Open(nil, sealed[:ns], sealed[ns:], []byte(id))
	if err != nil {
		return nil, ErrTampered
	}
	return out, nil
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

// LoadOrCreateKey reads the sealing key from path, or creates it (0600, in a 0700 directory)
// when it does not exist. The file holds the key in base64. A key file readable by group or
// others is refused.
func LoadOrCreateKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key := make([]byte, KeySize)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("generating sealing key: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("creating directory of sealing key %s: %w", path, err)
		}
		// Whole and durable, or not at all, and never replacing another process's key: a power
		// loss right after the first start must not leave an empty key file, or none, beside a
		// database that already holds secrets sealed with the key.
		created, cerr := durable.CreateFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600)
		if cerr != nil {
			return nil, fmt.Errorf("creating sealing key: %w", cerr)
		}
		if created {
			return key, nil
		}
		// Another process created it first: use that one.
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("reading sealing key %s: %w", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("checking sealing key %s: %w", path, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("sealing key %s has mode %v: it must not be readable by group or others (chmod 600)", path, st.Mode().Perm())
	}
	return ParseKey(string(b))
}

// ParseKey decodes a base64 key as given in a file, flag or environment variable.
func ParseKey(s string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
	if err != nil {
		return nil, errors.New("sealing key is not valid base64")
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("sealing key must decode to %d bytes, got %d", KeySize, len(key))
	}
	return key, nil
}
