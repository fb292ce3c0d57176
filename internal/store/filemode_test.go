package store_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"bcd/internal/store"
)

// A new SQLite store, and the WAL SQLite makes beside it, are readable by their owner only:
// the database holds sealed secrets and token hashes.
func TestNewSQLiteStoreIsPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bcd.db")
	st, err := store.Open(context.Background(), "sqlite:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, f := range []string{path, path + "-wal"} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode().Perm(); m&0o077 != 0 {
			t.Errorf("%s has mode %v, want no access for group or others", filepath.Base(f), m)
		}
	}
}
