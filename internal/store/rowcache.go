package store

import (
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// rowCache holds the nodes and the open workflows (or that there is none) SQLite's writer
// read or wrote, as its
// connection sees them, so that the next transaction on the same node takes them from memory:
// a report reads its node and the node's open workflow, and the report before it on that node
// wrote them (two statements of about a dozen per command, and most of what the writer
// allocates). Only the writer's goroutine uses it.
//
// It never holds what the database does not:
//   - SQLite's pre-update hook logs the rowid of each row of nodes or workflows a statement of
//     the writer changes or deletes, whatever the statement (a node's power, a workflow closed
//     with its node), and the rowid and node of each workflow inserted. The cache drops those
//     nodes, and the open workflow of the node of each workflow row: a workflow's node never
//     changes (a trigger refuses it), so a change to one can change which is open for its node
//     alone. A change to a workflow whose node the cache does not know drops every workflow.
//   - A write that knows the row it leaves (UpdateNode; UpdateWorkflow's step) puts it back.
//   - Any rollback empties the cache, and so does a commit of another connection (SQLite's
//     data version, read as each transaction begins).
type rowCache struct {
	nodes map[string]cachedNode // by id
	// nodeIDs are the ids of the cached nodes by rowid, wfNodes the nodes of the workflows the
	// cache read or saw inserted, open or not, by the workflow's rowid.
	nodeIDs map[int64]string
	open    map[string]cachedWorkflow // by node id
	wfNodes map[int64]string
	// changes is C memory the pre-update hook writes the keys of changed rows to (see
	// logCount and the others); version the database's data version the writer's last
	// transaction left (see began).
	changes      uintptr
	version      uint32
	versionKnown bool
	// reads and hits count lookups, and those that found the row (read by other goroutines).
	hits, reads atomic.Int64
}

type cachedNode struct {
	n   Node
	row int64
}

// cachedWorkflow is a node's open workflow, at rowid row; or, ok false, that it has none.
type cachedWorkflow struct {
	w   Workflow
	row int64
	ok  bool
}

// maxCachedRows bounds each map: past it the map is emptied (a fleet larger than that still
// finds most rows, at a read each after the map is emptied).
const maxCachedRows = 1 << 15

// The pre-update hook's log, in C memory: a header, then entries of a tag and a key (a rowid,
// or a node's id).
const (
	logCount    = 0  // int32: entries written
	logOverflow = 4  // int32: a change the log could not take (the cache must be emptied)
	logWfCol    = 8  // int32: the column of workflows holding the node's id
	logValue    = 16 // a sqlite3_value* slot for sqlite3_preupdate_new
	logMain     = 24 // "main", the schema whose data version is read
	logVersion  = 32 // uint32: the data version SQLITE_FCNTL_DATA_VERSION wrote
	logEntries  = 40
	logEntry    = 64 // tag, length, key; and at logRowAt a rowid
	logKeyMax   = 54
	logRowAt    = 56 // (8-aligned: the entries begin at a multiple of 8, each 64 long)
	logCap      = 256
	logSize     = logEntries + logCap*logEntry

	tagNodeRow     = 1 // a node's rowid, changed or deleted
	tagWorkflowRow = 2 // a workflow's rowid, changed or deleted
	tagWorkflowFor = 3 // a workflow inserted: its rowid, and the id of its node
)

func newRowCache(tls *libc.TLS, wfCol int32) *rowCache {
	p := libc.Xcalloc(tls, 1, logSize)
	if p == 0 {
		return nil
	}
	*(*int32)(at(p + logWfCol)) = wfCol
	copy(unsafe.Slice((*byte)(at(p+logMain)), 5), "main\x00")
	return &rowCache{nodes: map[string]cachedNode{}, nodeIDs: map[int64]string{}, open: map[string]cachedWorkflow{}, wfNodes: map[int64]string{}, changes: p}
}

func (rc *rowCache) free(tls *libc.TLS) {
	if rc != nil && rc.changes != 0 {
		libc.Xfree(tls, rc.changes)
		rc.changes = 0
	}
}

// cFunc is the C function pointer of Go function f (modernc's representation: the address of
// f's func value).
func cFunc[T any](f T) uintptr { return *(*uintptr)(unsafe.Pointer(&struct{ f T }{f})) }

// rowChanged is the writer's pre-update hook (sqlite3_preupdate_hook): it logs the rowid of a
// row of nodes or workflows about to change or go, and the node of a workflow inserted.
func rowChanged(tls *libc.TLS, log, db uintptr, op int32, zDb, zTab uintptr, oldRow, newRow int64) {
	switch {
	case cStringIs(zTab, "nodes"):
		if op != sqlite3.SQLITE_INSERT {
			logRow(log, tagNodeRow, oldRow)
		}
	case cStringIs(zTab, "workflows"):
		if op != sqlite3.SQLITE_INSERT {
			logRow(log, tagWorkflowRow, oldRow)
			return
		}
		n := (*int32)(at(log + logCount))
		if sqlite3.Xsqlite3_preupdate_new(tls, db, *(*int32)(at(log + logWfCol)), log+logValue) != sqlite3.SQLITE_OK || *n >= logCap {
			*(*int32)(at(log + logOverflow)) = 1
			return
		}
		v := *word(log + logValue)
		text, size := sqlite3.Xsqlite3_value_text(tls, v), sqlite3.Xsqlite3_value_bytes(tls, v)
		if text == 0 || size > logKeyMax {
			*(*int32)(at(log + logOverflow)) = 1
			return
		}
		e := log + logEntries + uintptr(*n)*logEntry
		*(*byte)(at(e)), *(*byte)(at(e + 1)) = tagWorkflowFor, byte(size)
		copy(unsafe.Slice((*byte)(at(e+2)), size), unsafe.Slice((*byte)(at(text)), size))
		*(*int64)(at(e + logRowAt)) = newRow
		*n++
	}
}

// logRow appends a rowid to the log.
func logRow(log uintptr, tag byte, row int64) {
	n := (*int32)(at(log + logCount))
	if *n >= logCap {
		*(*int32)(at(log + logOverflow)) = 1
		return
	}
	e := log + logEntries + uintptr(*n)*logEntry
	*(*byte)(at(e)) = tag
	*(*int64)(at(e + logRowAt)) = row
	*n++
}

// cStringIs says whether the C string at p is s.
func cStringIs(p uintptr, s string) bool {
	if p == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if *(*byte)(at(p + uintptr(i))) != s[i] {
			return false // (a shorter string stops here at its NUL)
		}
	}
	return *(*byte)(at(p + uintptr(len(s)))) == 0
}

// apply drops the rows the hook logged since the last call.
func (rc *rowCache) apply() {
	if rc.changes == 0 {
		return // (freed with its connection)
	}
	n := (*int32)(at(rc.changes + logCount))
	over := (*int32)(at(rc.changes + logOverflow))
	if *n == 0 && *over == 0 {
		return
	}
	if *over != 0 {
		rc.clearMaps()
	} else {
		for i := range uintptr(*n) {
			e := rc.changes + logEntries + i*logEntry
			row := *(*int64)(at(e + logRowAt))
			switch *(*byte)(at(e)) {
			case tagNodeRow:
				if id, ok := rc.nodeIDs[row]; ok {
					delete(rc.nodes, id)
					delete(rc.nodeIDs, row)
				}
			case tagWorkflowRow:
				if id, ok := rc.wfNodes[row]; ok {
					delete(rc.open, id)
				} else {
					clear(rc.open) // (whose node's open workflow it may be is not known)
				}
			case tagWorkflowFor:
				id := string(unsafe.Slice((*byte)(at(e+2)), *(*byte)(at(e + 1))))
				rc.knowWorkflow(row, id)
				delete(rc.open, id)
			}
		}
	}
	*n, *over = 0, 0
}

// readVersion is what SQLITE_FCNTL_DATA_VERSION says of the database: a number that changes
// with every change to it, by this connection or another.
func (rc *rowCache) readVersion(tls *libc.TLS, db uintptr) (uint32, bool) {
	if rc.changes == 0 || sqlite3.Xsqlite3_file_control(tls, db, rc.changes+logMain, sqlite3.SQLITE_FCNTL_DATA_VERSION, rc.changes+logVersion) != sqlite3.SQLITE_OK {
		return 0, false
	}
	return *(*uint32)(at(rc.changes + logVersion)), true
}

// began checks, as a transaction begins, that the database changed only through the writer's
// own commits since the cache was last true (else it empties the cache).
func (rc *rowCache) began(tls *libc.TLS, db uintptr) {
	if v, ok := rc.readVersion(tls, db); !ok || !rc.versionKnown || v != rc.version {
		rc.clear()
	}
}

// ended records the data version a transaction's end (its commit or rollback) left.
func (rc *rowCache) ended(tls *libc.TLS, db uintptr) {
	rc.version, rc.versionKnown = rc.readVersion(tls, db)
}

// clear empties the cache (nil: no cache).
func (rc *rowCache) clear() {
	if rc != nil {
		rc.apply()
		rc.clearMaps()
	}
}

func (rc *rowCache) clearMaps() {
	clear(rc.nodes)
	clear(rc.nodeIDs)
	clear(rc.open)
	clear(rc.wfNodes)
}

// ran takes what statement q changed; a rollback (of the transaction, or to a savepoint)
// restores rows without the hook: it empties the cache.
func (rc *rowCache) ran(q string) {
	if strings.HasPrefix(q, "ROLLBACK") {
		rc.clear()
		return
	}
	rc.apply()
}

// node returns the cached node id (a copy the caller may change).
func (rc *rowCache) node(id string) (Node, bool) {
	if rc == nil {
		return Node{}, false
	}
	c, ok := rc.peekNode(id)
	rc.reads.Add(1)
	if ok {
		rc.hits.Add(1)
	}
	return cloneNode(c.n), ok
}

// peekNode is node without a copy of its maps (for a caller that only reads it), uncounted.
func (rc *rowCache) peekNode(id string) (cachedNode, bool) {
	if rc == nil {
		return cachedNode{}, false
	}
	rc.apply()
	c, ok := rc.nodes[id]
	return c, ok
}

// putNode caches n, the row at rowid row.
func (rc *rowCache) putNode(n Node, row int64) {
	if rc == nil {
		return
	}
	rc.apply()
	if len(rc.nodes) >= maxCachedRows {
		clear(rc.nodes)
		clear(rc.nodeIDs)
	}
	if old, ok := rc.nodes[n.ID]; ok {
		delete(rc.nodeIDs, old.row)
	}
	rc.nodes[n.ID], rc.nodeIDs[row] = cachedNode{cloneNode(n), row}, n.ID
}

// workflow returns the cached open workflow of node nodeID (a copy; open false: it has none),
// and whether the cache knows it.
func (rc *rowCache) workflow(nodeID string) (w Workflow, open, cached bool) {
	if rc == nil {
		return Workflow{}, false, false
	}
	c, cached := rc.peekWorkflow(nodeID)
	rc.reads.Add(1)
	if cached {
		rc.hits.Add(1)
	}
	c.w.CommandKinds = slices.Clone(c.w.CommandKinds)
	return c.w, c.ok, cached
}

// peekWorkflow is workflow without a copy of its slice, uncounted.
func (rc *rowCache) peekWorkflow(nodeID string) (cachedWorkflow, bool) {
	if rc == nil {
		return cachedWorkflow{}, false
	}
	rc.apply()
	c, ok := rc.open[nodeID]
	return c, ok
}

// putWorkflow caches w as the open workflow of its node, the row at rowid row.
func (rc *rowCache) putWorkflow(w Workflow, row int64) {
	if rc == nil {
		return
	}
	rc.apply()
	if len(rc.open) >= maxCachedRows {
		clear(rc.open)
	}
	w.CommandKinds = slices.Clone(w.CommandKinds)
	rc.open[w.NodeID] = cachedWorkflow{w, row, true}
	rc.knowWorkflow(row, w.NodeID)
}

// putNoWorkflow caches that node nodeID has no open workflow.
func (rc *rowCache) putNoWorkflow(nodeID string) {
	if rc == nil {
		return
	}
	rc.apply()
	if len(rc.open) >= maxCachedRows {
		clear(rc.open)
	}
	rc.open[nodeID] = cachedWorkflow{}
}

// knowWorkflow records that the workflow at rowid row is node nodeID's.
func (rc *rowCache) knowWorkflow(row int64, nodeID string) {
	if len(rc.wfNodes) >= 4*maxCachedRows {
		clear(rc.wfNodes)
	}
	rc.wfNodes[row] = nodeID
}

func cloneNode(n Node) Node {
	n.Drivers, n.Labels, n.Conditions = maps.Clone(n.Drivers), maps.Clone(n.Labels), maps.Clone(n.Conditions)
	n.MACs = slices.Clone(n.MACs)
	return n
}
