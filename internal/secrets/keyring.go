package secrets

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"bcd/internal/durable"
)

// Keyring is an installation's sealing keys: the first seals, every one opens. Outside a key
// rotation it holds one key. Its text (a key file, BCD_SEAL_KEY) is one base64 key per line,
// the sealing key first; "#" starts a comment; a file of one key is the key file of versions
// before keyrings. Formatting or logging a Keyring shows its key ids, never its keys.
type Keyring struct {
	keys [][]byte
}

// NewKeyring returns the keyring of keys, the first sealing. It refuses no key, a key of the
// wrong size and a key given twice.
func NewKeyring(keys ...[]byte) (Keyring, error) {
	if len(keys) == 0 {
		return Keyring{}, errors.New("the sealing keyring holds no key")
	}
	r := Keyring{}
	seen := map[[KeyIDSize]byte]int{}
	for i, k := range keys {
		if len(k) != KeySize {
			return Keyring{}, fmt.Errorf("sealing key %d of the keyring must be %d bytes, got %d", i+1, KeySize, len(k))
		}
		id := keyID(k)
		if j, dup := seen[id]; dup {
			return Keyring{}, fmt.Errorf("sealing key %d of the keyring repeats key %d (%s): give each key once", i+1, j+1, hex.EncodeToString(id[:]))
		}
		seen[id] = i + 1
		r.keys = append(r.keys, append([]byte(nil), k...))
	}
	return r, nil
}

// Len is the number of keys.
func (r Keyring) Len() int { return len(r.keys) }

// IDs are the ids of the keys (KeyID), the sealing key's first.
func (r Keyring) IDs() []string {
	out := make([]string, len(r.keys))
	for i, k := range r.keys {
		out[i] = KeyID(k)
	}
	return out
}

// String shows the key ids: "keyring[SEALING, OTHER…]".
func (r Keyring) String() string { return "keyring[" + strings.Join(r.IDs(), ", ") + "]" }

// Format prints String whatever the verb: no verb shows the keys.
func (r Keyring) Format(f fmt.State, _ rune) { io.WriteString(f, r.String()) }

// LogValue logs the key ids only.
func (r Keyring) LogValue() slog.Value { return slog.StringValue(r.String()) }

// Text is the keyring as a key file holds it. One key is written as versions before keyrings
// wrote it (its base64 on one line).
func (r Keyring) Text() []byte {
	var b strings.Builder
	if len(r.keys) > 1 {
		b.WriteString("# bcd sealing keyring: the first key seals, every key opens; `bcd secrets rotate-key` re-seals under the first and removes the others\n")
	}
	for _, k := range r.keys {
		b.WriteString(base64.StdEncoding.EncodeToString(k))
		if len(r.keys) > 1 {
			b.WriteString("  # key " + KeyID(k))
		}
		b.WriteString("\n")
	}
	return []byte(b.String())
}

// KeyID is a key's id: the first 8 bytes of HMAC-SHA256(key, "bcd sealing key id"), in hex. It
// names the key in sealed values and messages and tells nothing of the key.
func KeyID(key []byte) string {
	id := keyID(key)
	return hex.EncodeToString(id[:])
}

func keyID(key []byte) [KeyIDSize]byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("bcd sealing key id"))
	var id [KeyIDSize]byte
	copy(id[:], m.Sum(nil))
	return id
}

// ParseKeyring decodes a keyring's text (Keyring): base64 keys, one per line (or separated by
// spaces or commas, as an environment variable may hold them), "#" to the end of a line a
// comment. Errors name the line, never its content.
func ParseKeyring(s string) (Keyring, error) {
	var keys [][]byte
	for n, line := range strings.Split(s, "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, field := range strings.FieldsFunc(line, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '\r' }) {
			key, err := ParseKey(field)
			if err != nil {
				return Keyring{}, fmt.Errorf("line %d: %w", n+1, err)
			}
			keys = append(keys, key)
		}
	}
	if len(keys) == 0 {
		return Keyring{}, errors.New("the sealing keyring holds no key: expected base64 keys of 32 bytes, one per line")
	}
	return NewKeyring(keys...)
}

// LoadOrCreateKeyring reads the keyring from path, or creates it with one new key (0600, in a
// 0700 directory) when it does not exist. A key file readable by group or others is refused.
func LoadOrCreateKeyring(path string) (Keyring, error) {
	_, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		key := make([]byte, KeySize)
		if _, err := rand.Read(key); err != nil {
			return Keyring{}, fmt.Errorf("generating sealing key: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return Keyring{}, fmt.Errorf("creating directory of sealing key %s: %w", path, err)
		}
		// Whole and durable, or not at all, and never replacing another process's key: a power
		// loss right after the first start must not leave an empty key file, or none, beside a
		// database that already holds secrets sealed with the key.
		created, cerr := durable.CreateFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600)
		if cerr != nil {
			return Keyring{}, fmt.Errorf("creating sealing key: %w", cerr)
		}
		if created {
			return NewKeyring(key)
		}
		// Another process created it first: use that one.
	}
	return LoadKeyring(path)
}

// LoadKeyring reads the keyring of an existing key file, refused if group or others may read it.
func LoadKeyring(path string) (Keyring, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Keyring{}, fmt.Errorf("reading sealing key %s: %w", path, err)
	}
	st, err := os.Stat(path)
	if err != nil {
		return Keyring{}, fmt.Errorf("checking sealing key %s: %w", path, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return Keyring{}, fmt.Errorf("sealing key %s has mode %v: it must not be readable by group or others (chmod 600)", path, st.Mode().Perm())
	}
	r, err := ParseKeyring(string(b))
	if err != nil {
		return Keyring{}, fmt.Errorf("sealing key %s: %w", path, err)
	}
	return r, nil
}

// WriteKeyring replaces the key file at path with r (0600), atomically and durably: a crash
// leaves the old keyring or the new one, whole.
func WriteKeyring(path string, r Keyring) error {
	if len(r.keys) == 0 {
		return errors.New("writing the sealing keyring: it holds no key")
	}
	if err := durable.WriteFile(path, r.Text(), 0o600); err != nil {
		return fmt.Errorf("writing the sealing keyring: %w", err)
	}
	return nil
}

// LoadOrCreateKey is LoadOrCreateKeyring's sealing key.
func LoadOrCreateKey(path string) ([]byte, error) {
	r, err := LoadOrCreateKeyring(path)
	if err != nil {
		return nil, err
	}
	return r.keys[0], nil
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
