package store

import (
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// openLiteForTest opens a writer connection on a new database with table kv.
func openLiteForTest(t *testing.T) *liteConn {
	t.Helper()
	c, err := openLite(filepath.Join(t.TempDir(), "lite.db"), []string{"journal_mode=WAL", "foreign_keys=1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.close(); err != nil {
			t.Error(err)
		}
	})
	if _, err := c.exec(`CREATE TABLE kv (k TEXT PRIMARY KEY, s TEXT, i INTEGER, f REAL, b BLOB)`, nil); err != nil {
		t.Fatal(err)
	}
	return c
}

type namedString string
type namedInt int64
type namedBytes []byte

// Each kind of argument the store binds reads back as it was written, into each kind of
// destination the store scans into; an empty string stays a string (not NULL), a nil byte
// slice is NULL.
func TestLiteBindsAndScansAsDatabaseSQL(t *testing.T) {
	c := openLiteForTest(t)
	cases := []struct {
		name string
		arg  any
		col  string
		dest func() any
		want string // fmt.Sprint of the scanned value, or "error: …" (a prefix)
	}{
		{"string into string", "hello", "s", func() any { return new(string) }, "hello"},
		{"empty string is not NULL", "", "s", func() any { return new(any) }, ""},
		{"named string", namedString("ready"), "s", func() any { return new(namedString) }, "ready"},
		{"int64", int64(-7), "i", func() any { return new(int64) }, "-7"},
		{"int", 42, "i", func() any { return new(int) }, "42"},
		{"named int", namedInt(9), "i", func() any { return new(namedInt) }, "9"},
		{"bool true", true, "i", func() any { return new(bool) }, "true"},
		{"bool false", false, "i", func() any { return new(bool) }, "false"},
		{"integer into string", int64(12), "i", func() any { return new(string) }, "12"},
		{"float", 2.5, "f", func() any { return new(float64) }, "2.5"},
		{"bytes", []byte{0, 1, 2}, "b", func() any { return new([]byte) }, "[0 1 2]"},
		{"empty bytes", []byte{}, "b", func() any { return new(any) }, "[]"},
		{"nil bytes are NULL", []byte(nil), "b", func() any { return new(any) }, "<nil>"},
		{"named bytes", namedBytes("key"), "b", func() any { return new(namedBytes) }, "[107 101 121]"},
		{"nil", nil, "s", func() any { return new(sql.NullString) }, "{ false}"},
		{"NULL into string", nil, "s", func() any { return new(string) }, "error: scanning column 0: converting NULL to string"},
		{"text into int", "x1", "s", func() any { return new(int64) }, "error: scanning column 0: strconv.ParseInt"},
		{"unsupported argument", struct{}{}, "s", func() any { return new(string) }, "error: running"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := fmt.Sprint(i)
			var err error
			if _, err = c.exec(`INSERT INTO kv (k, `+tc.col+`) VALUES (?, ?)`, []any{k, tc.arg}); err == nil {
				d := tc.dest()
				if err = c.queryRow(`SELECT `+tc.col+` FROM kv WHERE k = ?`, []any{k}).Scan(d); err == nil {
					got := fmt.Sprint(deref(d))
					if got != tc.want {
						t.Errorf("read back %q, want %q", got, tc.want)
					}
					return
				}
			}
			if !strings.HasPrefix(tc.want, "error: ") || !strings.HasPrefix(err.Error(), strings.TrimPrefix(tc.want, "error: ")) {
				t.Errorf("error %v, want %s", err, tc.want)
			}
		})
	}
}

func deref(p any) any {
	switch x := p.(type) {
	case *string:
		return *x
	case *namedString:
		return *x
	case *int64:
		return *x
	case *int:
		return *x
	case *namedInt:
		return *x
	case *bool:
		return *x
	case *float64:
		return *x
	case *[]byte:
		return *x
	case *namedBytes:
		return []byte(*x)
	case *any:
		if b, ok := (*x).([]byte); ok {
			return b
		}
		return *x
	case *sql.NullString:
		return *x
	}
	return p
}

// A statement run again while rows read from it are open gets a statement of its own (the
// cached one is not reset under the reader); errors read as the driver words them; no row is
// sql.ErrNoRows; a transaction's end resets the rows a caller left open.
func TestLiteStatementsAndTransactions(t *testing.T) {
	c := openLiteForTest(t)
	for _, k := range []string{"a", "b", "c"} {
		if _, err := c.exec(`INSERT INTO kv (k, i) VALUES (?, ?)`, []any{k, 1}); err != nil {
			t.Fatal(err)
		}
	}
	const q = `SELECT k FROM kv WHERE i = ? ORDER BY k`
	outer, err := c.query(q, []any{1})
	if err != nil {
		t.Fatal(err)
	}
	var pairs []string
	for outer.Next() {
		var k string
		if err := outer.Scan(&k); err != nil {
			t.Fatal(err)
		}
		inner, err := c.query(q, []any{1})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for inner.Next() {
			n++
		}
		inner.Close()
		pairs = append(pairs, fmt.Sprintf("%s:%d", k, n))
	}
	if err := outer.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a:3", "b:3", "c:3"}; !slices.Equal(pairs, want) {
		t.Errorf("nested reads of one statement: %v, want %v", pairs, want)
	}

	_, err = c.exec(`INSERT INTO kv (k) VALUES (?)`, []any{"a"})
	if !isUnique(err) || !strings.Contains(err.Error(), "UNIQUE constraint failed: kv.k") {
		t.Errorf("a duplicate key: %v, want a unique-constraint error naming kv.k", err)
	}
	var s string
	if err := c.queryRow(`SELECT s FROM kv WHERE k = ?`, []any{"nope"}).Scan(&s); !errors.Is(err, sql.ErrNoRows) {
		t.Errorf("no row: %v, want sql.ErrNoRows", err)
	}
	if _, err := c.exec(`INSERT INTO kv (k) VALUES (?, ?)`, []any{"x"}); err == nil {
		t.Error("a statement that does not parse ran")
	}
	if _, err := c.exec(`INSERT INTO kv (k) VALUES (?)`, []any{"x", "y"}); err == nil || !strings.Contains(err.Error(), "2 arguments for 1 parameters") {
		t.Errorf("too many arguments: %v", err)
	}
	if _, err := c.exec(`INSERT INTO kv (k) VALUES ('y'); DELETE FROM kv`, nil); err == nil || !strings.Contains(err.Error(), "more than one statement") {
		t.Errorf("two statements in one text: %v", err)
	}
	if _, err := c.exec(`INSERT INTO kv (k) VALUES ('z');  `, nil); err != nil {
		t.Errorf("one statement ending in a semicolon: %v", err)
	}
	if _, err := c.exec(`DELETE FROM kv WHERE k = 'z'`, nil); err != nil {
		t.Fatal(err)
	}

	tx, err := c.begin()
	if err != nil {
		t.Fatal(err)
	}
	left, err := c.query(`SELECT k FROM kv`, nil) // never closed by its reader
	if err != nil || !left.Next() {
		t.Fatal(err)
	}
	if _, err := c.exec(`INSERT INTO kv (k) VALUES ('d')`, nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	tx, err = c.begin()
	if err != nil {
		t.Fatalf("a transaction after one whose rows were left open: %v", err)
	}
	if _, err := c.exec(`INSERT INTO kv (k) VALUES ('e')`, nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	rows, err := c.query(`SELECT k FROM kv ORDER BY k`, nil)
	ks, err := collect(rows, err, "keys", scanID)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c", "e"}; !slices.Equal(ks, want) {
		t.Errorf("keys %v, want %v (d rolled back, e committed)", ks, want)
	}
}
