// Package store is the control plane's SQL store: one schema, two engines (SQLite through
// modernc.org/sqlite, embedded and the default; PostgreSQL through pgx). Queries are written once
// with ? placeholders and rebound for PostgreSQL. Every state change of a node is written in one
// transaction together with its event row and its reconciler wake-up row.
package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"github.com/pressly/goose/v3"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

//go:embed migrations
var migrations embed.FS

// Engine is the SQL engine behind a store.
type Engine string

const (
	SQLite   Engine = "sqlite"
	Postgres Engine = "postgres"
)

// Store is the control plane's store.
type Store struct {
	engine Engine
	write  *sql.DB // SQLite: one connection, BEGIN IMMEDIATE; PostgreSQL: the pool
	read   *sql.DB // SQLite: a pool of read-only connections; PostgreSQL: the same pool
	binds  sync.Map
	now    func() time.Time
}

// Sentinel errors, wrapped with what was being done.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("already exists")
	ErrStale    = errors.New("changed concurrently")
)

// ParseDSN tells the engine of a DSN: "sqlite:PATH" (or a bare path ending in .db) or
// "postgres://…" / "postgresql://…".
func ParseDSN(dsn string) (Engine, string, error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return Postgres, dsn, nil
	case strings.HasPrefix(dsn, "sqlite:"):
		p := strings.TrimPrefix(strings.TrimPrefix(dsn, "sqlite:"), "//")
		if p == "" {
			return "", "", errors.New("store DSN sqlite: needs a file path, e.g. sqlite:/var/lib/bcd/bcd.db")
		}
		return SQLite, p, nil
	case strings.HasSuffix(dsn, ".db"):
		return SQLite, dsn, nil
	}
	return "", "", fmt.Errorf("unrecognised store DSN %q: accepted are sqlite:PATH and postgres://USER@HOST/DB", redactDSN(dsn))
}

func redactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		return dsn
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// Open connects to the store named by dsn and applies the embedded migrations.
func Open(ctx context.Context, dsn string) (*Store, error) {
	engine, target, err := ParseDSN(dsn)
	if err != nil {
		return nil, err
	}
	s := &Store{engine: engine, now: time.Now}
	switch engine {
	case SQLite:
		if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
			return nil, fmt.Errorf("creating store directory: %w", err)
		}
		pragmas := "_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)"
		w, err := sql.Open("sqlite", "file:"+target+"?"+pragmas+"&_txlock=immediate")
		if err != nil {
			return nil, fmt.Errorf("opening sqlite store %s: %w", target, err)
		}
		w.SetMaxOpenConns(1)
		w.SetMaxIdleConns(1)
		w.SetConnMaxLifetime(0)
		// Migrate through the writer before readers open the file.
		s.write, s.read = w, w
		if err := s.migrate(ctx); err != nil {
			w.Close()
			return nil, err
		}
		r, err := sql.Open("sqlite", "file:"+target+"?"+pragmas+"&_pragma=query_only(1)")
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("opening sqlite store %s for reading: %w", target, err)
		}
		r.SetMaxOpenConns(8)
		r.SetMaxIdleConns(8)
		s.read = r
	case Postgres:
		db, err := sql.Open("pgx", target)
		if err != nil {
			return nil, fmt.Errorf("opening postgres store %s: %w", redactDSN(target), err)
		}
		db.SetMaxOpenConns(32)
		db.SetMaxIdleConns(32)
		s.write, s.read = db, db
		if err := db.PingContext(ctx); err != nil {
			db.Close()
			return nil, fmt.Errorf("connecting to postgres store %s: %w", redactDSN(target), err)
		}
		if err := s.migrate(ctx); err != nil {
			db.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *Store) migrate(ctx context.Context) error {
	dir := "migrations/sqlite"
	dialect := goose.DialectSQLite3
	if s.engine == Postgres {
		dir, dialect = "migrations/postgres", goose.DialectPostgres
	}
	sub, err := fs.Sub(migrations, dir)
	if err != nil {
		return fmt.Errorf("opening embedded migrations: %w", err)
	}
	p, err := goose.NewProvider(dialect, s.write, sub)
	if err != nil {
		return fmt.Errorf("preparing migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("applying migrations: %w", err)
	}
	return nil
}

// Engine returns the store's engine.
func (s *Store) Engine() Engine { return s.engine }

// Close closes the connections.
func (s *Store) Close() error {
	var errs []error
	if s.read != s.write {
		errs = append(errs, s.read.Close())
	}
	errs = append(errs, s.write.Close())
	return errors.Join(errs...)
}

// SetClock replaces the clock (tests).
func (s *Store) SetClock(now func() time.Time) { s.now = now }

// Now is the store's clock in Unix microseconds.
func (s *Store) nowMicros() int64 { return s.now().UnixMicro() }

// bind rewrites ? placeholders to $n for PostgreSQL (queries never hold a literal '?').
func (s *Store) bind(q string) string {
	if s.engine != Postgres {
		return q
	}
	if v, ok := s.binds.Load(q); ok {
		return v.(string)
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	out := b.String()
	s.binds.Store(q, out)
	return out
}

// Tx is a write transaction.
type Tx struct {
	s  *Store
	tx *sql.Tx
	at int64
}

func (t *Tx) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	return t.tx.ExecContext(ctx, t.s.bind(q), args...)
}

func (t *Tx) query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return t.tx.QueryContext(ctx, t.s.bind(q), args...)
}

func (t *Tx) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	return t.tx.QueryRowContext(ctx, t.s.bind(q), args...)
}

// forUpdate is the row-lock suffix: PostgreSQL locks the row, SQLite's writer is already alone.
func (t *Tx) forUpdate() string {
	if t.s.engine == Postgres {
		return " FOR UPDATE"
	}
	return ""
}

// Write runs f in one write transaction, retried on serialization failures.
func (s *Store) Write(ctx context.Context, f func(*Tx) error) error {
	for attempt := 0; ; attempt++ {
		err := s.writeOnce(ctx, f)
		if err == nil || attempt >= 4 || !retryable(err) {
			return err
		}
	}
}

func (s *Store) writeOnce(ctx context.Context, f func(*Tx) error) error {
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("beginning transaction: %w", err)
	}
	t := &Tx{s: s, tx: tx, at: s.nowMicros()}
	if err := f(t); err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("committing transaction: %w", err)
	}
	return nil
}

func retryable(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "SQLSTATE 40001") || strings.Contains(msg, "SQLSTATE 40P01") || strings.Contains(msg, "database is locked")
}

// isUnique reports a unique-constraint violation on either engine.
func isUnique(err error) bool {
	if err == nil {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "UNIQUE constraint failed") || strings.Contains(msg, "SQLSTATE 23505")
}

func (s *Store) queryRows(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	return s.read.QueryContext(ctx, s.bind(q), args...)
}

func (s *Store) queryRow(ctx context.Context, q string, args ...any) *sql.Row {
	return s.read.QueryRowContext(ctx, s.bind(q), args...)
}
