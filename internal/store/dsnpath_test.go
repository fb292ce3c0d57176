package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// A data directory's name may hold characters that mean something in a URI ('#', '?', '%'):
// the store is the file at that path, not one at a path cut short at them. Two directories that
// differ only after such a character are two stores (a cut path would make them one, beside
// the per-directory lock that is meant to keep two servers off one store).
func TestSQLitePathWithURICharacters(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	for _, dir := range []string{"a#1", "a#2", "b?x=1", "c%41", "d%", "e&f=g"} {
		p := filepath.Join(base, dir, "bcd.db")
		s, err := Open(ctx, "sqlite:"+p)
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		if err := s.Write(ctx, func(tx *Tx) error { _, err := tx.InsertTenant(ctx, "t-"+dir); return err }); err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		s.Close()
		fi, err := os.Stat(p)
		if err != nil || fi.Size() == 0 {
			t.Errorf("%s: the store's file %s: %v (size %v), want the database there", dir, p, err, fi)
		}
		s, err = Open(ctx, "sqlite:"+p)
		if err != nil {
			t.Fatal(err)
		}
		ts, err := s.Tenants(ctx)
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		// The default tenant is made by the server, not the store: only this directory's one.
		if len(ts) != 1 || ts[0].Name != "t-"+dir {
			t.Errorf("%s: tenants %+v, want only t-%s (another directory's store was opened)", dir, ts, dir)
		}
	}
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		if !e.IsDir() {
			t.Errorf("a file %s appeared beside the data directories", e.Name())
		}
	}
}
