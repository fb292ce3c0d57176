// Package storetest opens fresh stores on both engines for tests. The PostgreSQL half needs
// BCD_TEST_POSTGRES_DSN (.ci/pg-start prints one); under CI=true its absence fails the test
// instead of skipping it, so CI never silently runs SQLite alone.
package storetest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bcd/internal/store"
)

// Engines lists the engines every store test runs on.
var Engines = []store.Engine{store.SQLite, store.Postgres}

// EnvPostgresDSN names the variable holding the test PostgreSQL server.
const EnvPostgresDSN = "BCD_TEST_POSTGRES_DSN"

// DSN returns a DSN of a fresh, empty database of engine e (a new SQLite file, or a new schema
// on the test PostgreSQL server, dropped when the test ends).
func DSN(t testing.TB, e store.Engine) string {
	t.Helper()
	switch e {
	case store.SQLite:
		return "sqlite:" + filepath.Join(t.TempDir(), "bcd.db")
	case store.Postgres:
		base := os.Getenv(EnvPostgresDSN)
		if base == "" {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not set: CI must run the PostgreSQL half of the store tests (.ci/pg-start prints a DSN)", EnvPostgresDSN)
			}
			t.Skipf("%s not set: PostgreSQL half skipped outside CI", EnvPostgresDSN)
		}
		b := make([]byte, 6)
		rand.Read(b)
		schema := "t_" + hex.EncodeToString(b)
		db, err := sql.Open("pgx", base)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec("CREATE SCHEMA " + schema); err != nil {
			db.Close()
			t.Fatalf("creating test schema: %v", err)
		}
		t.Cleanup(func() {
			db.Exec("DROP SCHEMA " + schema + " CASCADE")
			db.Close()
		})
		sep := "?"
		if strings.Contains(base, "?") {
			sep = "&"
		}
		return base + sep + "search_path=" + schema
	}
	t.Fatalf("unknown engine %s", e)
	return ""
}

// Open opens a fresh store of engine e, closed when the test ends.
func Open(t testing.TB, e store.Engine) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), DSN(t, e))
	if err != nil {
		t.Fatalf("opening %s store: %v", e, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// Each runs f once per engine as a subtest.
func Each(t *testing.T, f func(t *testing.T, st *store.Store)) {
	for _, e := range Engines {
		t.Run(string(e), func(t *testing.T) {
			f(t, Open(t, e))
		})
	}
}

// AwaitBlocked waits, up to 20 s, until a session of the PostgreSQL server behind db waits for
// a lock that the backend holder (its pg_backend_pid) holds. ended says, with an error, that
// the session meant to wait ended instead; the test fails then, and when the time is up.
func AwaitBlocked(t testing.TB, db *sql.DB, holder int, ended func() error) {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(20 * time.Second); ; {
		var waiting int
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))`, holder).Scan(&waiting); err != nil {
			t.Fatalf("reading who waits for backend %d: %v", holder, err)
		}
		if waiting > 0 {
			return
		}
		if err := ended(); err != nil {
			t.Fatalf("ended without waiting for backend %d's lock: %v", holder, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing waited for backend %d's lock within 20 s", holder)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
