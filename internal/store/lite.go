package store

import (
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"modernc.org/libc"
	"modernc.org/libc/sys/types"
	sqlite3 "modernc.org/sqlite/lib"
)

// liteConn is the SQLite writer's connection, opened through SQLite's own interface (modernc's
// Go translation of it) rather than through database/sql and its driver. Only the writer's
// goroutine uses it, one statement after another, so it is opened without SQLite's connection
// mutex (SQLITE_OPEN_NOMUTEX), which its driver takes around every call (each column read,
// each argument bound), and its statements skip database/sql's bookkeeping: together a fifth
// of the writer's time when every write went through them. SQLite's own global mutexes (its
// allocator, page cache, file locks) stay on: the readers and the checkpointer share them
// through the driver.
type liteConn struct {
	tls *libc.TLS
	db  uintptr
	// out is C memory for the pointers SQLite's calls hand back (a statement, a database; and
	// at out+8, where a statement's text ends).
	out   uintptr
	stmts map[string]*liteStmt
	// vfs is the VFS the connection writes through (walVFS), unregistered once it is closed.
	vfs *walVFS
	// statements counts the statements run (exec, query): read by other goroutines.
	statements atomic.Int64
	// reprepares counts the times SQLite prepared a statement again as it ran, and reprepared
	// by the statement's text (under repMu: read by other goroutines). SQLite does that when the
	// schema changed, and at every run of a statement whose plan it chose by the value bound to
	// one of its parameters (a parameter compared with a column a partial index's WHERE names):
	// tens of microseconds each time, in the writer.
	reprepares atomic.Int64
	repMu      sync.Mutex
	reprepared map[string]int64
	// walFrames is the count of pages the connection's commits wrote to the WAL, as its last
	// commit left it (walVFS.frames, read by other goroutines).
	walFrames atomic.Int64
	// cache holds the open workflows the connection read or wrote (nil: none, see
	// workflowCache).
	cache *workflowCache
	// texts holds the text values the connection read last, to hand out again (textCache).
	texts textCache
	// scan is where its rows' nodes and commands are scanned (scanScratch).
	scan scanScratch
}

// scanScratch is where the writer's connection scans the rows it reads most, a node's and a
// command's: scanning into a value on the stack would move it, and the list of its fields
// handed to Scan, to the heap at every read (they pass through an interface). The row is then
// copied out and the scratch emptied (release). busy marks it taken, so a scan inside another
// (none today) would allocate instead of sharing it.
type scanScratch struct {
	node     Node
	nodeCols nodeTextCols
	cmd      Command
	cmdGen   int64
	dst      [48]any
	busy     bool
}

// scratchOf is the scratch of r's connection when r is the writer's row or rows and the
// scratch is free; nil otherwise (a reader's rows: the scan allocates).
func scratchOf(r rowScanner) *scanScratch {
	s, ok := r.(interface{ scratch() *scanScratch })
	if !ok {
		return nil
	}
	sc := s.scratch()
	if sc == nil || sc.busy {
		return nil
	}
	return sc
}

// takeScratch is scratchOf, taken (busy) until its release.
func takeScratch(r rowScanner) *scanScratch {
	sc := scratchOf(r)
	if sc != nil {
		sc.busy = true
	}
	return sc
}

// release empties the scratch, holding nothing of the row it scanned, and frees it.
func (sc *scanScratch) release() { *sc = scanScratch{} }

func (r *liteRows) scratch() *scanScratch { return &r.st.c.scan }

func (r liteRow) scratch() *scanScratch {
	if r.rows == nil {
		return nil
	}
	return r.rows.scratch()
}

// textCache hands out a text column's value as the string it gave for the same bytes before,
// when it still holds it: most of what the writer reads recurs (a tenant's, a site's and a
// pool's ids on every node, states, kinds, drivers), and each string is an allocation the
// collector then pays for. It is direct-mapped by a hash of the bytes; a value that misses
// replaces its slot's.
type textCache struct {
	seed  maphash.Seed
	slots *[textCacheSlots]string
}

const (
	textCacheSlots = 1024 // a power of two
	// textCacheMax is the longest value kept: longer ones (arguments, results, steps) rarely
	// recur byte for byte.
	textCacheMax = 160
)

// text returns b as a string.
func (c *textCache) text(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > textCacheMax {
		return string(b)
	}
	if c.slots == nil {
		c.seed, c.slots = maphash.MakeSeed(), new([textCacheSlots]string)
	}
	slot := &c.slots[maphash.Bytes(c.seed, b)&(textCacheSlots-1)]
	if *slot == string(b) {
		return *slot
	}
	*slot = string(b)
	return *slot
}

// liteStmt is a prepared statement. Its text and blob arguments are copied into buf, C memory
// it owns, and bound in place: they stay valid until it runs again or is finalized.
type liteStmt struct {
	c      *liteConn
	p      uintptr
	q      string // its text
	params int
	buf    uintptr
	bufCap int
	// cached: kept in c.stmts for the next run of its text. busy: rows read from it are
	// still open (a statement run again meanwhile gets a statement of its own).
	cached, busy bool
}

// maxLiteStmts bounds the writer's prepared statements (a few dozen texts recur; a text built
// with a variable number of placeholders varies).
const maxLiteStmts = 512

// openLite opens the database file at path, runs pragmas on it, and returns the connection.
func openLite(path string, pragmas []string) (*liteConn, error) {
	return openLiteConn(path, pragmas, true)
}

// openLiteReader opens a connection that only reads, as openLite opens the writer's: SQLite's
// own interface, without SQLite's connection mutex (its user holds one of its own), through
// SQLite's own VFS and without the writer's workflow cache.
func openLiteReader(path string, pragmas []string) (*liteConn, error) {
	return openLiteConn(path, pragmas, false)
}

func openLiteConn(path string, pragmas []string, writer bool) (_ *liteConn, err error) {
	separatePageCaches() // (Open did; a test may open the writer alone)
	role := "the SQLite writer"
	if !writer {
		role = "the SQLite reader"
	}
	c := &liteConn{tls: libc.NewTLS(), stmts: map[string]*liteStmt{}}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	if c.out = libc.Xmalloc(c.tls, 16); c.out == 0 {
		return nil, errors.New("opening the SQLite writer: out of memory")
	}
	name, err := libc.CString(path)
	if err != nil {
		return nil, err
	}
	defer libc.Xfree(c.tls, name)
	var vfs uintptr // (0: SQLite's default)
	if writer {
		if c.vfs, err = newWALVFS(); err != nil {
			return nil, err
		}
		vfs = c.vfs.name
	}
	rc := sqlite3.Xsqlite3_open_v2(c.tls, name, c.out,
		sqlite3.SQLITE_OPEN_READWRITE|sqlite3.SQLITE_OPEN_CREATE|sqlite3.SQLITE_OPEN_NOMUTEX|sqlite3.SQLITE_OPEN_EXRESCODE, vfs)
	c.db = c.outPtr(0)
	if rc != sqlite3.SQLITE_OK {
		return nil, fmt.Errorf("opening the SQLite store %s for %s: %w", path, role, c.errorOf(rc))
	}
	for _, p := range pragmas {
		if _, err := c.exec("PRAGMA "+p, nil); err != nil {
			return nil, fmt.Errorf("setting PRAGMA %s on %s: %w", p, role, err)
		}
	}
	if !writer {
		return c, nil
	}
	if err := c.cacheWorkflows(); err != nil {
		return nil, err
	}
	return c, nil
}

// cacheWorkflows gives the connection its workflowCache, with the pre-update hook that keeps it
// true.
func (c *liteConn) cacheWorkflows() error {
	var col any
	if err := c.queryRow(`SELECT (SELECT cid FROM pragma_table_info('workflows') WHERE name = 'node_id')`, nil).Scan(&col); err != nil {
		return fmt.Errorf("reading the column the SQLite writer's cache finds a workflow's node in: %w", err)
	}
	wfCol, ok := col.(int64)
	if !ok {
		return nil // (a database without the table: nothing to cache)
	}
	if c.cache = newWorkflowCache(c.tls, int32(wfCol)); c.cache == nil {
		return errors.New("opening the SQLite writer: out of memory")
	}
	c.cache.texts = &c.texts
	sqlite3.Xsqlite3_preupdate_hook(c.tls, c.db, cFunc(rowChanged), c.cache.changes)
	return nil
}

// outPtr reads the pointer SQLite's last call handed back in out (at out+off).
func (c *liteConn) outPtr(off uintptr) uintptr {
	b := libc.GoBytes(c.out+off, 8)
	if unsafe.Sizeof(uintptr(0)) == 4 {
		return uintptr(binary.NativeEndian.Uint32(b))
	}
	return uintptr(binary.NativeEndian.Uint64(b))
}

func (c *liteConn) close() error {
	var err error
	for q, st := range c.stmts {
		st.finalize()
		delete(c.stmts, q)
	}
	if c.db != 0 {
		if c.cache != nil {
			sqlite3.Xsqlite3_preupdate_hook(c.tls, c.db, 0, 0)
		}
		if rc := sqlite3.Xsqlite3_close(c.tls, c.db); rc != sqlite3.SQLITE_OK {
			// A statement is still open: the connection lives on until it ends (close_v2),
			// and writes through its VFS until then, which therefore stays.
			err = c.errorOf(rc)
			sqlite3.Xsqlite3_close_v2(c.tls, c.db)
			c.vfs = nil
		}
		c.db = 0
	}
	c.cache.free(c.tls) // (kept: WriterStats reads its counts)
	if c.vfs != nil {
		c.vfs.close()
		c.vfs = nil
	}
	if c.out != 0 {
		libc.Xfree(c.tls, c.out)
		c.out = 0
	}
	if c.tls != nil {
		c.tls.Close()
		c.tls = nil
	}
	return err
}

// liteError is an error SQLite returned, worded as its database/sql driver words it
// ("constraint failed: UNIQUE constraint failed: nodes.name (2067)"), which isUnique and
// retryable read.
type liteError struct{ msg string }

func (e *liteError) Error() string { return e.msg }

func (c *liteConn) errorOf(rc int32) error {
	str := libc.GoString(sqlite3.Xsqlite3_errstr(c.tls, rc))
	busy := ""
	if rc&0xff == sqlite3.SQLITE_BUSY {
		busy = " (SQLITE_BUSY)"
	}
	if c.db == 0 {
		return &liteError{msg: fmt.Sprintf("%s (%d)%s", str, rc, busy)}
	}
	if msg := libc.GoString(sqlite3.Xsqlite3_errmsg(c.tls, c.db)); msg != str {
		return &liteError{msg: fmt.Sprintf("%s: %s (%d)%s", str, msg, rc, busy)}
	}
	return &liteError{msg: fmt.Sprintf("%s (%d)%s", str, rc, busy)}
}

// prepare returns q's statement: the cached one if it is free, else a new one (cached when
// there is room and q has none).
func (c *liteConn) prepare(q string) (*liteStmt, error) {
	st, ok := c.stmts[q]
	if ok && !st.busy {
		return st, nil
	}
	text, err := libc.CString(q)
	if err != nil {
		return nil, err
	}
	defer libc.Xfree(c.tls, text)
	rc := sqlite3.Xsqlite3_prepare_v3(c.tls, c.db, text, -1, sqlite3.SQLITE_PREPARE_PERSISTENT, c.out, c.out+8)
	if rc != sqlite3.SQLITE_OK {
		return nil, fmt.Errorf("preparing %.60q: %w", q, c.errorOf(rc))
	}
	p := c.outPtr(0)
	if p == 0 {
		return nil, fmt.Errorf("preparing %.60q: no statement in it", q)
	}
	if rest := strings.TrimSpace(strings.TrimRight(libc.GoString(c.outPtr(8)), "; \t\n")); rest != "" {
		sqlite3.Xsqlite3_finalize(c.tls, p)
		return nil, fmt.Errorf("preparing %.60q: it holds more than one statement (%.40q after the first); the writer runs one at a time", q, rest)
	}
	st = &liteStmt{c: c, p: p, q: q, params: int(sqlite3.Xsqlite3_bind_parameter_count(c.tls, p))}
	if !ok && len(c.stmts) < maxLiteStmts {
		st.cached = true
		c.stmts[q] = st
	}
	return st, nil
}

func (st *liteStmt) finalize() {
	if st.p != 0 {
		sqlite3.Xsqlite3_finalize(st.c.tls, st.p)
		st.p = 0
	}
	if st.buf != 0 {
		libc.Xfree(st.c.tls, st.buf)
		st.buf, st.bufCap = 0, 0
	}
}

// done ends a run of the statement: reset for the next one, or finalized if it is not cached.
func (st *liteStmt) done() {
	st.busy = false
	if st.p == 0 {
		return // (finalized: the connection closed)
	}
	if n := sqlite3.Xsqlite3_stmt_status(st.c.tls, st.p, sqlite3.SQLITE_STMTSTATUS_REPREPARE, 1); n != 0 {
		st.c.noteReprepared(st.q, int64(n))
	}
	if !st.cached {
		st.finalize()
		return
	}
	sqlite3.Xsqlite3_reset(st.c.tls, st.p)
}

// noteReprepared counts n preparations again of the statement q.
func (c *liteConn) noteReprepared(q string, n int64) {
	c.reprepares.Add(n)
	c.repMu.Lock()
	defer c.repMu.Unlock()
	if c.reprepared == nil {
		c.reprepared = map[string]int64{}
	}
	if _, ok := c.reprepared[q]; ok || len(c.reprepared) < maxLiteStmts {
		c.reprepared[q] += n
	}
}

// liteArg converts an argument of a type bind does not take as it is (a named type, a
// driver.Valuer) as database/sql would: to an int64, float64, bool, string, []byte or nil.
func liteArg(v any) (any, error) {
	dv, err := driver.DefaultParameterConverter.ConvertValue(v)
	if err != nil {
		return nil, err
	}
	switch dv.(type) {
	case nil, int64, float64, bool, string, []byte:
		return dv, nil
	}
	return nil, fmt.Errorf("a %T argument: the SQLite writer binds integers, floats, booleans, strings, bytes and nil", v)
}

// bind binds args to the statement's parameters, in order.
func (st *liteStmt) bind(args []any) error {
	if len(args) != st.params {
		return fmt.Errorf("%d arguments for %d parameters", len(args), st.params)
	}
	// The arguments as bound: args itself unless one needs converting (a named type, a
	// driver.Valuer), which vals then holds. A pointer to a string, bytes, an integer or a
	// boolean (Tx.args) is bound as what it points at now, a nil one as NULL.
	vals, size, bytes := args, 0, false
	for i, a := range args {
		switch x := a.(type) {
		case nil, int64, float64, int, int32, bool, *int64, *int, *bool, *uint64:
			continue
		case string:
			size, bytes = size+len(x), true
			continue
		case []byte:
			size, bytes = size+len(x), true
			continue
		case *string:
			if x != nil {
				size, bytes = size+len(*x), true
			}
			continue
		case *[]byte:
			if x != nil {
				size, bytes = size+len(*x), true
			}
			continue
		}
		v, err := liteArg(a)
		if err != nil {
			return fmt.Errorf("argument %d: %w", i+1, err)
		}
		if &vals[0] == &args[0] {
			vals = slices.Clone(args)
		}
		vals[i] = v
		switch x := v.(type) {
		case string:
			size, bytes = size+len(x), true
		case []byte:
			size, bytes = size+len(x), true
		}
	}
	if bytes {
		if err := st.reserve(size); err != nil {
			return err
		}
	}
	tls, p, off := st.c.tls, st.p, 0
	// place copies b into the statement's buffer and returns where.
	place := func(b []byte) uintptr {
		at := st.buf + uintptr(off)
		copy(libc.GoBytes(at, len(b)), b)
		off += len(b)
		return at
	}
	// text binds s, blob b (nil: NULL), null NULL, each to parameter n.
	var n int32
	text := func(s string) int32 {
		return sqlite3.Xsqlite3_bind_text(tls, p, n, place(unsafe.Slice(unsafe.StringData(s), len(s))), int32(len(s)), 0)
	}
	null := func() int32 { return sqlite3.Xsqlite3_bind_null(tls, p, n) }
	blob := func(b []byte) int32 {
		if b == nil {
			return null()
		}
		return sqlite3.Xsqlite3_bind_blob(tls, p, n, place(b), int32(len(b)), 0)
	}
	for i, v := range vals {
		n = int32(i + 1)
		var rc int32
		switch x := v.(type) {
		case nil:
			rc = null()
		case float64:
			rc = sqlite3.Xsqlite3_bind_double(tls, p, n, x)
		case string:
			rc = text(x)
		case []byte:
			rc = blob(x)
		case *string:
			if rc = null(); x != nil {
				rc = text(*x)
			}
		case *[]byte:
			if rc = null(); x != nil {
				rc = blob(*x)
			}
		default: // (an integer or a boolean, or a pointer to one)
			if i, ok := intAt(x); ok {
				rc = sqlite3.Xsqlite3_bind_int64(tls, p, n, i)
			} else {
				rc = null()
			}
		}
		if rc != sqlite3.SQLITE_OK {
			return fmt.Errorf("binding argument %d: %w", n, st.c.errorOf(rc))
		}
	}
	return nil
}

// intAt is the integer an argument is or points at (a boolean as 0 or 1), and false for a nil
// pointer (bound as NULL, as database/sql binds one) or a value of another type. Pure.
func intAt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case int:
		return int64(x), true
	case int32:
		return int64(x), true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case *int64:
		if x != nil {
			return *x, true
		}
	case *int:
		if x != nil {
			return int64(*x), true
		}
	case *uint64:
		if x != nil {
			return int64(*x), true
		}
	case *bool:
		if x != nil {
			return intAt(*x)
		}
	}
	return 0, false
}

// reserve makes the statement's buffer hold at least size bytes of text and blob arguments,
// which SQLite reads from it until the next binding (they are bound without a copy). An empty
// string is bound at an address in the buffer (at none it would be NULL): the buffer exists
// even for size 0.
func (st *liteStmt) reserve(size int) error {
	if st.buf != 0 && size <= st.bufCap {
		return nil
	}
	n := max(size, 2*st.bufCap, 256)
	if st.buf != 0 {
		libc.Xfree(st.c.tls, st.buf)
		st.buf, st.bufCap = 0, 0
	}
	if st.buf = libc.Xmalloc(st.c.tls, types.Size_t(n)); st.buf == 0 {
		return fmt.Errorf("binding %d bytes of arguments: out of memory", size)
	}
	st.bufCap = n
	return nil
}

// bindEvents binds the rows of an insert of events (eventRowParams each: at, then the event's
// eight texts) without holding each value in an interface, as bind's arguments are: nine
// allocations an event, the most numerous of the writer's.
func (st *liteStmt) bindEvents(at int64, evs []Event) error {
	if want := len(evs) * eventRowParams; want != st.params {
		return fmt.Errorf("%d events (%d arguments) for %d parameters", len(evs), want, st.params)
	}
	size := 0
	for i := range evs {
		e := &evs[i]
		size += len(e.TenantID) + len(e.NodeID) + len(e.Actor) + len(e.Kind) + len(e.FromState) + len(e.ToState) + len(e.Reason) + max(len(e.Data), 2)
	}
	if err := st.reserve(size); err != nil {
		return err
	}
	tls, p, off := st.c.tls, st.p, uintptr(0)
	n := int32(0)
	text := func(s string) int32 {
		n++
		where := st.buf + off
		copy(libc.GoBytes(where, len(s)), s)
		off += uintptr(len(s))
		return sqlite3.Xsqlite3_bind_text(tls, p, n, where, int32(len(s)), 0)
	}
	for i := range evs {
		e := &evs[i]
		data := e.Data
		if data == "" {
			data = "{}"
		}
		n++
		rc := sqlite3.Xsqlite3_bind_int64(tls, p, n, at)
		for _, s := range [...]string{e.TenantID, e.NodeID, e.Actor, e.Kind, e.FromState, e.ToState, e.Reason, data} {
			if rc != sqlite3.SQLITE_OK {
				break
			}
			rc = text(s)
		}
		if rc != sqlite3.SQLITE_OK {
			return fmt.Errorf("binding argument %d: %w", n, st.c.errorOf(rc))
		}
	}
	return nil
}

// execEvents runs q, an insert of len(evs) events' rows (eventRowParams each), bound by
// bindEvents.
func (c *liteConn) execEvents(q string, at int64, evs []Event) error {
	_, err := c.run(q, func(st *liteStmt) error { return st.bindEvents(at, evs) })
	return err
}

// liteResult is what a statement changed.
type liteResult struct{ rows, id int64 }

func (r liteResult) LastInsertId() (int64, error) { return r.id, nil }
func (r liteResult) RowsAffected() (int64, error) { return r.rows, nil }

// exec runs q to its end (the rows of a RETURNING clause are read and dropped).
func (c *liteConn) exec(q string, args []any) (sql.Result, error) {
	return c.run(q, func(st *liteStmt) error { return st.bind(args) })
}

// run prepares q, binds its arguments (bind) and runs it to its end.
func (c *liteConn) run(q string, bind func(*liteStmt) error) (sql.Result, error) {
	c.statements.Add(1)
	st, err := c.prepare(q)
	if err != nil {
		return nil, err
	}
	defer st.done()
	if err := bind(st); err != nil {
		return nil, fmt.Errorf("running %.60q: %w", q, err)
	}
	if c.cache != nil {
		defer c.cache.ran(q)
	}
	for {
		switch rc := sqlite3.Xsqlite3_step(c.tls, st.p); rc {
		case sqlite3.SQLITE_ROW:
		case sqlite3.SQLITE_DONE:
			return liteResult{rows: sqlite3.Xsqlite3_changes64(c.tls, c.db), id: sqlite3.Xsqlite3_last_insert_rowid(c.tls, c.db)}, nil
		default:
			return nil, c.errorOf(rc)
		}
	}
}

// query runs q and returns its rows, read as the caller steps through them; the caller closes
// them.
func (c *liteConn) query(q string, args []any) (*liteRows, error) {
	c.statements.Add(1)
	st, err := c.prepare(q)
	if err != nil {
		return nil, err
	}
	if err := st.bind(args); err != nil {
		st.done()
		return nil, fmt.Errorf("running %.60q: %w", q, err)
	}
	st.busy = true
	return &liteRows{st: st, cols: int(sqlite3.Xsqlite3_column_count(c.tls, st.p))}, nil
}

// liteRows are a query's rows (rowsIter).
type liteRows struct {
	st     *liteStmt
	cols   int
	err    error
	row    bool // Next stepped onto a row that Scan may read
	closed bool
}

func (r *liteRows) Next() bool {
	if r.closed {
		return false
	}
	switch rc := sqlite3.Xsqlite3_step(r.st.c.tls, r.st.p); rc {
	case sqlite3.SQLITE_ROW:
		r.row = true
		return true
	case sqlite3.SQLITE_DONE:
	default:
		r.err = r.st.c.errorOf(rc)
	}
	r.Close()
	return false
}

func (r *liteRows) Err() error { return r.err }

func (r *liteRows) Close() error {
	if !r.closed {
		r.closed, r.row = true, false
		r.st.done()
		if c := r.st.c; c.cache != nil {
			c.cache.apply()
		}
	}
	return nil
}

func (r *liteRows) Scan(dest ...any) error {
	if !r.row {
		return errors.New("scanning rows: no row (Next was not called, or returned false)")
	}
	if len(dest) != r.cols {
		return fmt.Errorf("scanning rows: %d columns into %d values", r.cols, len(dest))
	}
	tls, p := r.st.c.tls, r.st.p
	for i, d := range dest {
		n := int32(i)
		ct := sqlite3.Xsqlite3_column_type(tls, p, n)
		// The usual pairs, without boxing the value.
		switch ct {
		case sqlite3.SQLITE_INTEGER:
			switch d := d.(type) {
			case *int64:
				*d = sqlite3.Xsqlite3_column_int64(tls, p, n)
				continue
			case *bool:
				*d = sqlite3.Xsqlite3_column_int64(tls, p, n) != 0
				continue
			}
		case sqlite3.SQLITE_TEXT:
			if d, ok := d.(*string); ok {
				*d = r.st.c.texts.text(libc.GoBytes(sqlite3.Xsqlite3_column_text(tls, p, n), int(sqlite3.Xsqlite3_column_bytes(tls, p, n))))
				continue
			}
		}
		var v any
		switch ct {
		case sqlite3.SQLITE_INTEGER:
			v = sqlite3.Xsqlite3_column_int64(tls, p, n)
		case sqlite3.SQLITE_FLOAT:
			v = sqlite3.Xsqlite3_column_double(tls, p, n)
		case sqlite3.SQLITE_TEXT:
			at := sqlite3.Xsqlite3_column_text(tls, p, n)
			v = r.st.c.texts.text(libc.GoBytes(at, int(sqlite3.Xsqlite3_column_bytes(tls, p, n))))
		case sqlite3.SQLITE_BLOB:
			at := sqlite3.Xsqlite3_column_blob(tls, p, n)
			size := sqlite3.Xsqlite3_column_bytes(tls, p, n)
			b := make([]byte, size)
			if size > 0 {
				copy(b, libc.GoBytes(at, int(size)))
			}
			v = b
		}
		if err := assignColumn(d, v); err != nil {
			return fmt.Errorf("scanning column %d: %w", i, err)
		}
	}
	return nil
}

// queryRow runs q and returns its first row for Scan (sql.ErrNoRows when it has none).
func (c *liteConn) queryRow(q string, args []any) liteRow {
	rows, err := c.query(q, args)
	return liteRow{rows: rows, err: err}
}

type liteRow struct {
	rows *liteRows
	err  error
}

func (r liteRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	return r.rows.Scan(dest...)
}

// assignColumn stores v, a column's value (int64, float64, string, []byte or nil), in dest,
// converting it as database/sql's Scan does for the destinations the store reads into.
func assignColumn(dest, v any) error {
	switch d := dest.(type) {
	case *any:
		*d = v
		return nil
	case sql.Scanner:
		return d.Scan(v)
	case *string:
		switch x := v.(type) {
		case string:
			*d = x
		case []byte:
			*d = string(x)
		case int64:
			*d = strconv.FormatInt(x, 10)
		case float64:
			*d = strconv.FormatFloat(x, 'g', -1, 64)
		case nil:
			return errors.New("converting NULL to string is unsupported")
		}
		return nil
	case *[]byte:
		switch x := v.(type) {
		case []byte:
			*d = x
		case string:
			*d = []byte(x)
		case nil:
			*d = nil
		default:
			*d = []byte(fmt.Sprint(x))
		}
		return nil
	case *int64:
		n, err := liteInt(v, 64)
		*d = n
		return err
	case *int:
		n, err := liteInt(v, strconv.IntSize)
		*d = int(n)
		return err
	case *int32:
		n, err := liteInt(v, 32)
		*d = int32(n)
		return err
	case *bool:
		switch x := v.(type) {
		case int64:
			*d = x != 0
			return nil
		case string:
			b, err := strconv.ParseBool(x)
			*d = b
			return err
		case nil:
			return errors.New("converting NULL to bool is unsupported")
		}
		return fmt.Errorf("converting %T to bool is unsupported", v)
	case *float64:
		switch x := v.(type) {
		case float64:
			*d = x
		case int64:
			*d = float64(x)
		case string:
			f, err := strconv.ParseFloat(x, 64)
			*d = f
			return err
		default:
			return fmt.Errorf("converting %T to float64 is unsupported", v)
		}
		return nil
	}
	// A named type of a basic kind (type State string, …), as database/sql sets it.
	rv := reflect.ValueOf(dest)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("destination is a %T, not a pointer", dest)
	}
	e := rv.Elem()
	switch e.Kind() {
	case reflect.String:
		var s string
		if err := assignColumn(&s, v); err != nil {
			return err
		}
		e.SetString(s)
		return nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := liteInt(v, e.Type().Bits())
		if err != nil {
			return err
		}
		e.SetInt(n)
		return nil
	case reflect.Bool:
		var b bool
		if err := assignColumn(&b, v); err != nil {
			return err
		}
		e.SetBool(b)
		return nil
	case reflect.Slice:
		if e.Type().Elem().Kind() != reflect.Uint8 {
			break
		}
		var b []byte
		if err := assignColumn(&b, v); err != nil {
			return err
		}
		e.SetBytes(b)
		return nil
	}
	return fmt.Errorf("scanning a %T into a %T is unsupported by the SQLite writer", v, dest)
}

// liteInt reads v as an integer of bits bits.
func liteInt(v any, bits int) (int64, error) {
	switch x := v.(type) {
	case int64:
		if bits < 64 && (x < -1<<(bits-1) || x >= 1<<(bits-1)) {
			return 0, fmt.Errorf("%d does not fit %d bits", x, bits)
		}
		return x, nil
	case string:
		return strconv.ParseInt(x, 10, bits)
	case []byte:
		return strconv.ParseInt(string(x), 10, bits)
	case nil:
		return 0, errors.New("converting NULL to an integer is unsupported")
	}
	return 0, fmt.Errorf("converting %T to an integer is unsupported", v)
}

// liteTx is a write transaction on the connection.
type liteTx struct{ c *liteConn }

// begin begins a write transaction, taking the database's write lock at once.
// The writer's cache is emptied if another connection committed since its last transaction.
func (c *liteConn) begin() (liteTx, error) {
	_, err := c.exec("BEGIN IMMEDIATE", nil)
	if err == nil && c.cache != nil {
		c.cache.began(c.tls, c.db)
	}
	return liteTx{c}, err
}

// ended records, for the writer's cache, where a transaction's end left the database.
func (c *liteConn) ended() {
	if c.cache != nil {
		c.cache.ended(c.tls, c.db)
	}
}

// Commit commits the transaction. One that cannot commit is rolled back, so the connection is
// never left inside it.
func (t liteTx) Commit() error {
	t.c.resetBusy()
	defer t.c.ended()
	_, err := t.c.exec("COMMIT", nil)
	if t.c.vfs != nil {
		t.c.walFrames.Store(t.c.vfs.frames())
	}
	if err != nil {
		t.c.cache.clear() // (what the transaction wrote is gone)
		if sqlite3.Xsqlite3_get_autocommit(t.c.tls, t.c.db) == 0 {
			t.c.exec("ROLLBACK", nil)
		}
		return err
	}
	return nil
}

// Rollback undoes the transaction.
func (t liteTx) Rollback() error {
	t.c.resetBusy()
	t.c.cache.clear()
	defer t.c.ended()
	if sqlite3.Xsqlite3_get_autocommit(t.c.tls, t.c.db) != 0 {
		return nil // SQLite already rolled it back (an I/O error, a full disk)
	}
	_, err := t.c.exec("ROLLBACK", nil)
	return err
}

// resetBusy resets the cached statements whose rows a caller left open: a transaction's end
// ends its reads.
func (c *liteConn) resetBusy() {
	for _, st := range c.stmts {
		if st.busy {
			st.done()
		}
	}
}
