package secrets

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestSealOpen(t *testing.T) {
	key := bytes.Repeat([]byte{7}, KeySize)
	s, err := NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := s.Seal("id1", []byte("hunter2-password"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("hunter2")) {
		t.Fatal("plaintext visible in sealed value")
	}
	got, err := s.Open("id1", sealed)
	if err != nil || string(got) != "hunter2-password" {
		t.Fatalf("open: %q %v", got, err)
	}
	other, _ := NewSealer(bytes.Repeat([]byte{8}, KeySize))
	flipped := append([]byte(nil), sealed...)
	flipped[len(flipped)-1] ^= 1
	cases := map[string]func() ([]byte, error){
		"other id":  func() ([]byte, error) { return s.Open("id2", sealed) },
		"other key": func() ([]byte, error) { return other.Open("id1", sealed) },
		"flipped":   func() ([]byte, error) { return s.Open("id1", flipped) },
		"short":     func() ([]byte, error) { return s.Open("id1", sealed[:5]) },
	}
	for name, f := range cases {
		if _, err := f(); !errors.Is(err, ErrTampered) {
			t.Errorf("%s: %v, want ErrTampered", name, err)
		}
	}
	if _, err := NewSealer([]byte("short")); err == nil {
		t.Error("short key accepted")
	}
}

func TestKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "seal.key")
	k1, err := LoadOrCreateKey(path)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v %v", st.Mode().Perm(), err)
	}
	k2, err := LoadOrCreateKey(path)
	if err != nil || !bytes.Equal(k1, k2) {
		t.Fatalf("reload: %v", err)
	}
	os.Chmod(path, 0o644)
	if _, err := LoadOrCreateKey(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable key accepted: %v", err)
	}
	if _, err := ParseKey("not base64!"); err == nil {
		t.Error("bad key accepted")
	}
}

// Servers starting at once on one data dir get one key: the first file linked in place wins,
// the others read it; no temporary file is left behind.
func TestKeyFileCreatedOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "seal.key")
	keys := make([][]byte, 8)
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() { keys[i], errs[i] = LoadOrCreateKey(path) })
	}
	wg.Wait()
	for i := range keys {
		if errs[i] != nil || !bytes.Equal(keys[i], keys[0]) {
			t.Fatalf("creator %d: %x %v (first: %x)", i, keys[i], errs[i], keys[0])
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("%d files in the directory, want the key alone", len(entries))
	}
}

func TestRef(t *testing.T) {
	id, err := ParseRef(Ref("abc"))
	if err != nil || id != "abc" {
		t.Fatal(id, err)
	}
	for _, bad := range []string{"", "secret://", "http://x", "abc"} {
		if _, err := ParseRef(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// A value is sealed only for a row: an empty id would bind it to nothing, so that it opens
// wherever a row's id is lost (a reference "secret://" parsed leniently, a column left empty).
func TestSealNeedsAnID(t *testing.T) {
	s, err := NewSealer(bytes.Repeat([]byte{7}, KeySize))
	if err != nil {
		t.Fatal(err)
	}
	if sealed, err := s.Seal("", []byte("hunter2")); err == nil {
		t.Errorf("sealed for no id: %x", sealed)
	}
	good, err := s.Seal("id1", []byte("hunter2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open("", good); err == nil {
		t.Error("opened for no id")
	}
	// A value sealed for no id (by an earlier version) does not open either.
	aead := s.keys[0].aead
	raw := make([]byte, aead.NonceSize())
	raw = aead.Seal(raw, raw, []byte("hunter2"), nil)
	if _, err := s.Open("", raw); err == nil {
		t.Error("a value sealed for no id opened")
	}
}
