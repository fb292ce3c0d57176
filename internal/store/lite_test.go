package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"
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
		// Pointers (Tx.args) are bound as what they point at, a nil one as NULL.
		{"pointer to string", ptr("node-1"), "s", func() any { return new(string) }, "node-1"},
		{"pointer to empty string is not NULL", ptr(""), "s", func() any { return new(any) }, ""},
		{"pointer to int64", ptr(int64(-1) << 40), "i", func() any { return new(int64) }, "-1099511627776"},
		{"pointer to int", ptr(300), "i", func() any { return new(int) }, "300"},
		{"pointer to uint64", ptr(uint64(1) << 40), "i", func() any { return new(int64) }, "1099511627776"},
		{"pointer to bool", ptr(true), "i", func() any { return new(bool) }, "true"},
		{"pointer to bytes", ptr([]byte{7, 8}), "b", func() any { return new([]byte) }, "[7 8]"},
		{"pointer to nil bytes is NULL", ptr([]byte(nil)), "b", func() any { return new(any) }, "<nil>"},
		{"nil pointer to string is NULL", (*string)(nil), "s", func() any { return new(sql.NullString) }, "{ false}"},
		{"nil pointer to int64 is NULL", (*int64)(nil), "i", func() any { return new(any) }, "<nil>"},
		{"nil pointer to bytes is NULL", (*[]byte)(nil), "b", func() any { return new(any) }, "<nil>"},
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

func ptr[T any](v T) *T { return &v }

// TestLiteBindsPointersWithoutAllocating: binding pointers to a row's fields (Tx.args) holds
// nothing new in an interface and copies nothing but the texts into the statement's buffer.
func TestLiteBindsPointersWithoutAllocating(t *testing.T) {
	c := openLiteForTest(t)
	st, err := c.prepare(`INSERT INTO kv (k, s, i, f, b) VALUES (?, ?, ?, ?, ?)`)
	if err != nil {
		t.Fatal(err)
	}
	k, s, i, b := "k", "text", int64(1)<<40, []byte{1, 2}
	n := 1 << 20
	args := []any{&k, &s, &i, &n, &b}
	if err := st.bind(args); err != nil {
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(100, func() { _ = st.bind(args) }); a != 0 {
		t.Errorf("binding pointers allocated %v times a statement, want 0", a)
	}
}

// TestTxArgsOffTheWriterAreValues: a transaction that is not SQLite's writer's (PostgreSQL's,
// whose writes may go out later) gets the values the pointers point at when args is called, as
// the statement would have bound them then; the writer's gets the pointers themselves.
func TestTxArgsOffTheWriterAreValues(t *testing.T) {
	s, i, u, b, by := "queued", int64(1)<<40, uint64(7), true, []byte{1}
	n := 3
	off := (&Tx{}).args(&s, &i, &n, &u, &b, &by, "as is", int64(5))
	s, i, n, u, b, by = "changed", 0, 0, 0, false, nil
	want := []any{"queued", int64(1) << 40, 3, int64(7), true, []byte{1}, "as is", int64(5)}
	if fmt.Sprint(off) != fmt.Sprint(want) {
		t.Errorf("args off the writer: %v, want %v", off, want)
	}
	for k, v := range off {
		if fmt.Sprintf("%T", v) != fmt.Sprintf("%T", want[k]) {
			t.Errorf("argument %d is a %T, want a %T", k, v, want[k])
		}
	}
	if nils := (&Tx{}).args((*string)(nil), (*[]byte)(nil)); nils[0] != nil || nils[1] != nil {
		t.Errorf("nil pointers off the writer: %v, want NULLs", nils)
	}
	on := (&Tx{lc: &liteConn{}}).args(&s, &i)
	if on[0] != any(&s) || on[1] != any(&i) {
		t.Errorf("args on the writer: %v, want the pointers", on)
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

// The writer's text cache gives the string it gave before for the same bytes, a string of its
// own (not a view of the bytes), and never a string of other bytes.
func TestTextCacheGivesTheSameStringForTheSameBytes(t *testing.T) {
	var c textCache
	same := func(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }
	buf := []byte("provisioning")
	first := c.text(buf)
	if first != "provisioning" {
		t.Fatalf("text = %q", first)
	}
	if again := c.text([]byte("provisioning")); again != first || !same(again, first) {
		t.Errorf("the same bytes again gave another string (%q)", again)
	}
	buf[0] = 'X' // what SQLite's buffer holds next must not reach a string handed out
	if first != "provisioning" {
		t.Errorf("the string changed with the bytes it came from: %q", first)
	}
	long := strings.Repeat("a", textCacheMax+1)
	if a, b := c.text([]byte(long)), c.text([]byte(long)); a != long || same(a, b) {
		t.Errorf("a value over %d bytes: %d bytes, kept: %v", textCacheMax, len(a), same(a, b))
	}
	if c.text(nil) != "" || c.text([]byte{}) != "" {
		t.Error("empty bytes gave a non-empty string")
	}
	// Many distinct values through 1 024 slots: each comes back as its own bytes.
	for i := range 5000 {
		want := fmt.Sprintf("value-%d", i)
		if got := c.text([]byte(want)); got != want {
			t.Fatalf("text(%q) = %q", want, got)
		}
	}
	for i := range 5000 {
		want := fmt.Sprintf("value-%d", i%37)
		if got := c.text([]byte(want)); got != want {
			t.Fatalf("text(%q) = %q", want, got)
		}
	}
}

// The writer scans nodes and commands into its connection's scratch and copies them out: each
// read is a value of its own, what a caller changes in one does not reach the next, and the
// scratch is left empty (holding nothing of the row).
func TestWriterScansIntoItsScratchAndCopiesOut(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	var node Node
	cmd := Command{Kind: "power.on", Subject: "bmc", RunsOn: "site", Args: `{"a":"b"}`}
	if err := s.Write(ctx, func(tx *Tx) error {
		pool, err := seedPool(ctx, tx)
		if err != nil {
			return err
		}
		node = redfishNode(pool, "n", "ready")
		node.Labels = map[string]string{"rack": "r1"}
		node.MACs = []string{"02:00:00:00:00:01"}
		if err := tx.InsertNode(ctx, &node); err != nil {
			return err
		}
		cmd.NodeID, cmd.TenantID, cmd.SiteID = node.ID, node.TenantID, node.SiteID
		return tx.InsertCommand(ctx, &cmd)
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, func(tx *Tx) error {
		first, err := tx.LockNode(ctx, node.ID, "")
		if err != nil {
			return err
		}
		firstCmd, err := tx.Command(ctx, cmd.ID)
		if err != nil {
			return err
		}
		first.Name, first.Labels["rack"], first.MACs[0] = "changed", "r2", "changed"
		firstCmd.Args = "changed"
		second, err := tx.LockNode(ctx, node.ID, "")
		if err != nil {
			return err
		}
		secondCmd, err := tx.Command(ctx, cmd.ID)
		if err != nil {
			return err
		}
		if second.Name != "n" || second.Labels["rack"] != "r1" || second.MACs[0] != "02:00:00:00:00:01" || second.ID != node.ID {
			t.Errorf("second read of the node = %q %v %v: the first read's changes reached it", second.Name, second.Labels, second.MACs)
		}
		if secondCmd.Args != `{"a":"b"}` || secondCmd.ID != cmd.ID || secondCmd.Kind != "power.on" {
			t.Errorf("second read of the command = %+v", secondCmd)
		}
		sc := &tx.lc.scan
		if sc.busy || !reflect.DeepEqual(sc.node, Node{}) || !reflect.DeepEqual(sc.cmd, Command{}) || sc.nodeCols != (nodeTextCols{}) {
			t.Error("the scratch was left holding a row")
		}
		for i, d := range sc.dst {
			if d != nil {
				t.Errorf("the scratch's destination %d was left set", i)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
