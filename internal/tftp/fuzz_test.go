package tftp

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// collect is an io.ReaderFrom that keeps what a route serves.
type collect struct{ bytes.Buffer }

func (c *collect) ReadFrom(r io.Reader) (int64, error) { return c.Buffer.ReadFrom(r) }

// FuzzCleanName feeds arbitrary requested file names (the RRQ's first string, as sent) through
// CleanName and a DirRoute whose directory holds a file, a subdirectory and a symlink that
// leads out of it: an accepted name is canonical, relative and free of "..", control bytes and
// backslashes; nothing outside the directory is ever served.
func FuzzCleanName(f *testing.F) {
	for _, s := range []string{"ipxe.efi", "./ipxe.efi", "arm64//ipxe.efi", "../secret", "a/../../secret", "/etc/passwd",
		`..\secret`, "out/secret", "sub/../ipxe.efi", "sub/./x", ".", "", "ipxe.efi\x00", strings.Repeat("a/", 130)} {
		f.Add(s)
	}
	outside := f.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("SECRET"), 0o644); err != nil {
		f.Fatal(err)
	}
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ipxe.efi"), []byte("IPXE"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "out")); err != nil {
		f.Fatal(err)
	}
	route, err := NewDirRoute(dir)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { route.Close() })
	f.Fuzz(func(t *testing.T, name string) {
		clean, err := CleanName(name)
		if err == nil {
			if !fs.ValidPath(clean) || clean == "." || len(clean) > maxNameLen || strings.ContainsAny(clean, "\\\x00") {
				t.Fatalf("CleanName(%q) = %q", name, clean)
			}
			for _, el := range strings.Split(clean, "/") {
				if el == ".." || el == "." || el == "" {
					t.Fatalf("CleanName(%q) = %q has element %q", name, clean, el)
				}
			}
			if again, err := CleanName(clean); err != nil || again != clean {
				t.Fatalf("CleanName(%q) = %q, but CleanName of that = %q, %v", name, clean, again, err)
			}
		}
		var w collect
		_ = Dispatch(context.Background(), []Route{route}, name, &w)
		if strings.Contains(w.String(), "SECRET") {
			t.Fatalf("%q served a file outside the directory", name)
		}
		if route.Has(name) && err != nil {
			t.Fatalf("Has(%q) with a name CleanName refuses (%v)", name, err)
		}
	})
}
