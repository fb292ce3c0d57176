package durable

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "table.json")
	for _, content := range []string{"first", "second, longer"} {
		if err := WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil || string(b) != content {
			t.Fatalf("read %q %v, want %q", b, err, content)
		}
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
	if es, _ := os.ReadDir(dir); len(es) != 1 {
		t.Fatalf("left behind: %v", es)
	}
	// A directory that cannot be written: the old content stays, the error names the file.
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o700)
	if os.Geteuid() != 0 { // root writes anyway
		if err := WriteFile(p, []byte("third"), 0o600); err == nil || !strings.Contains(err.Error(), p) {
			t.Fatalf("error %v, want one naming %s", err, p)
		}
		if b, _ := os.ReadFile(p); string(b) != "second, longer" {
			t.Fatalf("after a failed write: %q", b)
		}
	}
}

// TestCreateFile: of many concurrent creators exactly one creates the file, whole; the others
// find it and leave it.
func TestCreateFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "seal.key")
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	for i := range 8 {
		wg.Go(func() {
			ok, err := CreateFile(p, []byte(strings.Repeat(string(rune('a'+i)), 64)), 0o600)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				created++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b, err := os.ReadFile(p)
	if err != nil || created != 1 || len(b) != 64 || strings.Count(string(b), string(b[0])) != 64 {
		t.Fatalf("created %d times, content %q (%v)", created, b, err)
	}
	if es, _ := os.ReadDir(dir); len(es) != 1 {
		t.Fatalf("left behind: %v", es)
	}
}
