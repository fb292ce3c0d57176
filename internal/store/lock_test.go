package store_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"bcd/internal/store"
)

// One server at a time on an SQLite store: a second lock is refused, naming the holder, until
// the first is released; PostgreSQL takes none.
func TestLockSQLite(t *testing.T) {
	dsn := "sqlite:" + filepath.Join(t.TempDir(), "bcd.db")
	first, err := store.LockSQLite(dsn)
	if err != nil || first == nil {
		t.Fatalf("first lock: %v %v", first, err)
	}
	_, err = store.LockSQLite(dsn)
	if err == nil || !strings.Contains(err.Error(), "in use by another bcd server (pid ") || !strings.Contains(err.Error(), "need PostgreSQL") {
		t.Fatalf("second lock: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again, err := store.LockSQLite(dsn)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Close()
	if pg, err := store.LockSQLite("postgres://u:p@127.0.0.1:1/db"); pg != nil || err != nil {
		t.Fatalf("postgres: %v %v", pg, err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(strings.TrimPrefix(dsn, "sqlite:")), "bcd.db.lock")); err != nil {
		t.Fatal(err)
	}
}
