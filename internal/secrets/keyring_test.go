package secrets

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func testKey(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

// legacySeal seals as versions before keyrings did: nonce || ciphertext+tag, the id as
// additional data.
func legacySeal(t *testing.T, key []byte, nonce []byte, id, plain string) []byte {
	t.Helper()
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	return aead.Seal(append([]byte(nil), nonce...), nonce, []byte(plain), []byte(id))
}

func mustSealer(t *testing.T, keys ...[]byte) *Sealer {
	t.Helper()
	r, err := NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewKeyringSealer(r)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A keyed value names its key, and opens under any keyring holding it; legacy values (sealed
// before keyrings) open under the key that sealed them wherever it is in the keyring, even one
// whose random nonce starts with the magic, or with the magic and a held key's id.
func TestKeyedAndLegacyValues(t *testing.T) {
	oldKey, newKey := testKey(1), testKey(2)
	oldOnly, both, newOnly := mustSealer(t, oldKey), mustSealer(t, newKey, oldKey), mustSealer(t, newKey)
	keyed, err := oldOnly.Seal("id1", []byte("pw-old"))
	if err != nil {
		t.Fatal(err)
	}
	if got := KeyIDOf(keyed); got != KeyID(oldKey) || !bytes.HasPrefix(keyed, []byte(Magic)) {
		t.Fatalf("keyed value names %q (header %x), want %s", got, keyed[:headerSize], KeyID(oldKey))
	}
	plainNonce := bytes.Repeat([]byte{0x42}, 12)
	magicNonce := append([]byte(Magic), bytes.Repeat([]byte{0x99}, 8)...)
	newIDNonce := func() []byte { id := keyID(newKey); return append([]byte(Magic), id[:]...) }()
	oldIDNonce := func() []byte { id := keyID(oldKey); return append([]byte(Magic), id[:]...) }()
	cases := []struct {
		name   string
		sealed []byte
		opens  map[string]*Sealer
		fails  map[string]*Sealer
	}{
		{"keyed under old", keyed, map[string]*Sealer{"old": oldOnly, "both": both}, map[string]*Sealer{"new": newOnly}},
		{"legacy", legacySeal(t, oldKey, plainNonce, "id1", "pw-old"), map[string]*Sealer{"old": oldOnly, "both": both}, map[string]*Sealer{"new": newOnly}},
		{"legacy, nonce starting with the magic", legacySeal(t, oldKey, magicNonce, "id1", "pw-old"), map[string]*Sealer{"old": oldOnly, "both": both}, map[string]*Sealer{"new": newOnly}},
		{"legacy, nonce reading as the new key's header", legacySeal(t, oldKey, newIDNonce, "id1", "pw-old"), map[string]*Sealer{"old": oldOnly, "both": both}, map[string]*Sealer{"new": newOnly}},
		{"legacy, nonce reading as its own key's header", legacySeal(t, oldKey, oldIDNonce, "id1", "pw-old"), map[string]*Sealer{"old": oldOnly, "both": both}, map[string]*Sealer{"new": newOnly}},
	}
	for _, c := range cases {
		for name, s := range c.opens {
			if got, err := s.Open("id1", c.sealed); err != nil || string(got) != "pw-old" {
				t.Errorf("%s, keyring %s: %q %v", c.name, name, got, err)
			}
			if _, err := s.Open("id2", c.sealed); !errors.Is(err, ErrTampered) {
				t.Errorf("%s, keyring %s: opened for another row: %v", c.name, name, err)
			}
		}
		for name, s := range c.fails {
			if _, err := s.Open("id1", c.sealed); !errors.Is(err, ErrTampered) {
				t.Errorf("%s, keyring %s: %v, want ErrTampered", c.name, name, err)
			}
		}
	}
}

// A value whose header was altered, stripped or added opens under no reading: its key id
// changed to another key of the keyring, to a key it does not hold, its magic broken, the
// header cut off (read as legacy), or a legacy value given a header.
func TestTamperedKeyIDRefused(t *testing.T) {
	oldKey, newKey := testKey(1), testKey(2)
	both := mustSealer(t, newKey, oldKey)
	sealed, err := both.Seal("id1", []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	alter := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), sealed...)) }
	otherID, unknownID := keyID(oldKey), keyID(testKey(3))
	legacy := legacySeal(t, newKey, bytes.Repeat([]byte{7}, 12), "id1", "pw")
	newID := keyID(newKey)
	cases := []struct {
		name    string
		sealed  []byte
		missing bool // ErrKeyMissing besides ErrTampered
	}{
		{"key id of the keyring's other key", alter(func(b []byte) []byte { copy(b[len(Magic):], otherID[:]); return b }), false},
		{"key id of a key not held", alter(func(b []byte) []byte { copy(b[len(Magic):], unknownID[:]); return b }), true},
		{"one bit of the key id", alter(func(b []byte) []byte { b[len(Magic)] ^= 1; return b }), true},
		{"magic broken", alter(func(b []byte) []byte { b[0] ^= 1; return b }), false},
		{"header cut off", alter(func(b []byte) []byte { return b[headerSize:] }), false},
		{"legacy value given a header", append(append([]byte(Magic), newID[:]...), legacy...), false},
		{"too short", []byte(Magic), false},
	}
	for _, c := range cases {
		_, err := both.Open("id1", c.sealed)
		if !errors.Is(err, ErrTampered) || errors.Is(err, ErrKeyMissing) != c.missing {
			t.Errorf("%s: %v (missing %v)", c.name, err, c.missing)
		}
	}
}

// A value sealed under a key the keyring does not hold says which key.
func TestKeyMissingNamesTheKey(t *testing.T) {
	sealed, err := mustSealer(t, testKey(2)).Seal("id1", []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = mustSealer(t, testKey(1)).Open("id1", sealed)
	var km *KeyMissingError
	if !errors.As(err, &km) || km.KeyID != KeyID(testKey(2)) || !strings.Contains(err.Error(), KeyID(testKey(2))) || !errors.Is(err, ErrTampered) {
		t.Fatalf("%v", err)
	}
}

// Reseal leaves a value under the sealing key alone and re-seals any other under it, the
// plaintext unchanged.
func TestReseal(t *testing.T) {
	oldKey, newKey := testKey(1), testKey(2)
	both, newOnly := mustSealer(t, newKey, oldKey), mustSealer(t, newKey)
	underOld, _ := mustSealer(t, oldKey).Seal("id1", []byte("pw"))
	underNew, _ := newOnly.Seal("id1", []byte("pw"))
	for name, c := range map[string]struct {
		sealed  []byte
		changed bool
	}{
		"legacy":  {legacySeal(t, oldKey, bytes.Repeat([]byte{5}, 12), "id1", "pw"), true},
		"old key": {underOld, true},
		"new key": {underNew, false},
	} {
		out, changed, err := both.Reseal("id1", c.sealed)
		if err != nil || changed != c.changed {
			t.Errorf("%s: changed %v %v", name, changed, err)
			continue
		}
		if got, err := newOnly.Open("id1", out); err != nil || string(got) != "pw" || KeyIDOf(out) != KeyID(newKey) {
			t.Errorf("%s: re-sealed value: %q %v", name, got, err)
		}
		if !changed && !bytes.Equal(out, c.sealed) {
			t.Errorf("%s: unchanged value rewritten", name)
		}
	}
	if _, _, err := both.Reseal("id1", underOld[:20]); !errors.Is(err, ErrTampered) {
		t.Errorf("a value that does not open re-sealed: %v", err)
	}
}

// The keyring's text: one key is the key file of before keyrings; several are one per line,
// the sealing one first; comments, blank lines, commas and spaces are allowed; a bad key is
// refused naming its line, never its content; a key given twice is refused.
func TestParseKeyring(t *testing.T) {
	k1, k2 := testKey(1), testKey(2)
	b1, b2 := base64.StdEncoding.EncodeToString(k1), base64.StdEncoding.EncodeToString(k2)
	one, err := NewKeyring(k1)
	if err != nil {
		t.Fatal(err)
	}
	if string(one.Text()) != b1+"\n" {
		t.Errorf("one key written as %q, want the key file of before keyrings", one.Text())
	}
	two, _ := NewKeyring(k2, k1)
	for name, text := range map[string]string{
		"written":      string(two.Text()),
		"comments":     "# ring\n\n" + b2 + "  # new\n" + b1 + "\n",
		"commas":       b2 + "," + b1,
		"spaces, CRLF": b2 + " " + b1 + "\r\n",
	} {
		r, err := ParseKeyring(text)
		if err != nil || r.Len() != 2 || r.IDs()[0] != KeyID(k2) || r.IDs()[1] != KeyID(k1) {
			t.Errorf("%s: %v %v", name, r, err)
		}
	}
	bad := "c2VjcmV0LXNlY3JldA=="
	for name, text := range map[string]string{
		"empty":      "# nothing\n",
		"short key":  b1 + "\n" + bad + "\n",
		"not base64": b1 + "\nhunter2!!\n",
		"twice":      b1 + "\n" + b1 + "\n",
	} {
		_, err := ParseKeyring(text)
		if err == nil {
			t.Errorf("%s accepted", name)
			continue
		}
		if strings.Contains(err.Error(), bad) || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), b1) {
			t.Errorf("%s: the error shows a key: %v", name, err)
		}
		if name == "short key" && !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%s: the error names no line: %v", name, err)
		}
	}
}

// Formatting or logging a keyring, with any verb, shows key ids, never keys.
func TestKeyringNeverShowsKeys(t *testing.T) {
	r, _ := NewKeyring(testKey(1), testKey(2))
	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Info("loaded", "keyring", r)
	out := logs.String()
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%x", "%d", "%q"} {
		out += fmt.Sprintf(verb, r) + fmt.Sprintf(verb, []any{r}) + fmt.Sprintf(verb, struct{ R Keyring }{r})
	}
	for _, k := range [][]byte{testKey(1), testKey(2)} {
		for _, shown := range []string{base64.StdEncoding.EncodeToString(k), fmt.Sprintf("%x", k), fmt.Sprint(k), "[1 1 1 1", "0101010101"} {
			if strings.Contains(out, shown) {
				t.Fatalf("a key is shown (%q) in:\n%s", shown, out)
			}
		}
	}
	if !strings.Contains(out, KeyID(testKey(1))) {
		t.Errorf("the key ids are not shown: %s", out)
	}
}

// A keyring written replaces the file whole, 0600, and loads back; one readable by others is
// refused.
func TestWriteKeyring(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seal.key")
	one, err := LoadOrCreateKeyring(path)
	if err != nil || one.Len() != 1 {
		t.Fatal(one, err)
	}
	two, _ := NewKeyring(testKey(9), one.keys[0])
	if err := WriteKeyring(path, two); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", st.Mode().Perm(), err)
	}
	back, err := LoadOrCreateKeyring(path)
	if err != nil || fmt.Sprint(back.IDs()) != fmt.Sprint(two.IDs()) {
		t.Fatalf("%v %v", back, err)
	}
	if key, err := LoadOrCreateKey(path); err != nil || !bytes.Equal(key, testKey(9)) {
		t.Errorf("LoadOrCreateKey: not the sealing key (%v)", err)
	}
	os.Chmod(path, 0o640)
	if _, err := LoadKeyring(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("group-readable keyring accepted: %v", err)
	}
	if err := WriteKeyring(path, Keyring{}); err == nil {
		t.Error("an empty keyring written")
	}
}
