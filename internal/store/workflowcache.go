package store

import (
	"slices"
	"strings"
	"sync/atomic"
	"unique"
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// workflowCache holds each node's open workflow (or that it has none) as SQLite's writer read or
// wrote it, so that the next transaction on the node takes it from memory: a report reads its
// node's open workflow, and the report before it on that node wrote it (one statement of about
// a dozen per command). Only the writer's goroutine uses it.
//
// It never holds what the database does not:
//   - SQLite's pre-update hook logs the rowid of each workflow row a statement of the writer
//     changes or deletes, whatever the statement (a workflow closed with its node, an abort
//     requested), and the rowid and node of each workflow inserted. The cache drops the entry
//     of the node of each: a workflow's node never changes (a trigger refuses it), so a change
//     to one can change which workflow is open for its own node alone. A change to a workflow
//     whose node the cache does not know drops every entry.
//   - A write that knows the row it leaves puts it back: a workflow's step (UpdateWorkflow), a
//     workflow opened for a node with none (InsertWorkflow).
//   - Any rollback empties the cache, and so does a commit of another connection (SQLite's
//     data version, read as each transaction begins).
//
// And nodes: each node's row as the writer inserted, read or last changed it, with its rowid
// (cachedNode: its columns as stored, its maps decoded at each read). The hook logs the rowid of
// every node row a statement changes or deletes, and that entry goes. The writer's own
// statements of a node take its entry out first and put back the row they leave: UpdateNode
// (the columns it sets are the node's it was given, the others stay the entry's), the power it
// records, the deploy image it pins (a column the entry does not hold). A reconciliation and a
// report then read their node from memory (13 / 12 / 9 reads a node per phase).
//
// The same hook keeps wakes true: each node's wake-up row as the writer's SetWakeUp last set or
// read it (due at wakes[node], no failures, not leased), with its rowid. The hook logs the rowid
// of every wake-up row any statement changes, inserts or deletes, and the entry holding that
// rowid goes (a row keeps its rowid until it is deleted: the writer never vacuums, and another
// connection's vacuum changes the data version); a rollback or another connection's commit
// empties it with the rest. A reconciliation ends by setting its node's wake-up, and most
// find it already due sooner (the step before set it): SetWakeUp then knows its statement would
// change nothing, and does not run it (measured: 9 of 10 such statements changed nothing in
// enroll at 1 000 nodes, 6 of 8 in deploy, 4 of 6 in undeploy). A row it does not know it reads
// first, which costs less than the statement.
//
// And cmds: the commands the writer inserted, read or changed, with their rowids. The hook logs
// the rowid of every command row a statement changes or deletes, and that entry goes. The
// writer's own statements of a command (its claim, its acknowledgement, a report) take its entry
// out first and put back the row they leave; a command that ended leaves the cache. Its claim,
// acknowledgement and reports then read nothing (10 reads a node in enroll).
type workflowCache struct {
	open map[string]cachedWorkflow // by node id
	// wakes: each node's wake-up row the writer set or read, by node id.
	wakes rowEntries[cachedWake]
	// wfNodes are the nodes of the workflows the cache read or saw inserted, open or not, by
	// the workflow's rowid.
	wfNodes map[int64]string
	// cmds: commands as the writer inserted, read or changed them, by id.
	cmds rowEntries[*cachedCommand]
	// nodes: nodes' rows as the writer read or changed them, by id (cachedNode).
	nodes rowEntries[*cachedNode]
	// settings: what the writer read of small tables that rarely change (memoTables), by
	// table and the key it was read by; a change to a table (the hook) empties what was read
	// of it (memo, remember).
	settings [memoCount]map[string]any
	// changes is C memory the pre-update hook writes to (see logCount and the others); version
	// the database's data version the writer's last transaction left (see began).
	changes      uintptr
	version      uint32
	versionKnown bool
	// reads and hits count lookups, and those that found the node's entry (read by other
	// goroutines); cmdReads and cmdHits the same of commands.
	hits, reads         atomic.Int64
	cmdHits, cmdReads   atomic.Int64
	nodeHits, nodeReads atomic.Int64
	// texts is the connection's textCache: the strings of the nodes read from the cache.
	texts *textCache
}

// cachedWorkflow is a node's open workflow, at rowid row; or, ok false, that it has none.
// steps and cleanup hold its steps' JSON as one copy for every workflow of the same steps (a
// profile's).
type cachedWorkflow struct {
	w              Workflow
	row            int64
	ok             bool
	steps, cleanup unique.Handle[string]
}

// maxCachedRows bounds the entries: past it they are dropped (a fleet larger than that still
// finds most, at a read each after they are dropped).
const maxCachedRows = 1 << 15

// The pre-update hook's log, in C memory: a header, then entries of a tag, a rowid and for an
// insert the node's id.
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
	logRowAt    = 56   // (8-aligned: the entries begin at a multiple of 8, each 64 long)
	logCap      = 1024 // (a claim changes up to idsPerStatement commands in one statement)
	logSize     = logEntries + logCap*logEntry

	tagWorkflowRow = 2 // a workflow's rowid, changed or deleted
	tagWorkflowFor = 3 // a workflow inserted: its rowid, and the id of its node
	tagWakeRow     = 4 // a wake-up row's rowid, inserted, changed or deleted
	tagCommandRow  = 5 // a command's rowid, changed or deleted
	tagNodeRow     = 6 // a node's rowid, changed or deleted
	tagMemo        = 7 // a row of a memoTables table inserted, changed or deleted (its index as the rowid)
)

// A table of settings whose rows the writer keeps as read (workflowCache.settings).
type memoTable int

const (
	memoPools            memoTable = iota // Tx.Pool: by the id or name read
	memoPolicies                          // Tx.AnyApprovalPolicy, Tx.RequiredApprovals
	memoImages                            // Tx.VerifiedImage: the image's row, by name
	memoSigners                           // Tx.VerifiedImage: the signer's rows, by name
	memoDeployProfiles                    // Tx.Profile: a definition or none, by name
	memoHardwareProfiles                  // Tx.HardwareProfile: by name
	memoPlans                             // Tx.InsertWorkflow (keepPlan): a plan's used_at, by digest
	memoCount
)

// memoTables are the tables' names, by memoTable.
var memoTables = [memoCount]string{"pools", "approval_policies", "images", "signers", "deploy_profiles", "hardware_profiles", "workflow_plans"}

// maxMemoKeys bounds what the writer keeps of one such table (emptied past it).
const maxMemoKeys = 1024

// memo returns what the writer read of table by key, if it holds it (rc nil: never). A value
// holding maps is the caller's to copy.
func (rc *workflowCache) memo(table memoTable, key string) (any, bool) {
	if rc == nil {
		return nil, false
	}
	rc.apply()
	v, ok := rc.settings[table][key]
	return v, ok
}

// remember keeps v, what the writer just read of table by key (rc nil: nothing).
func (rc *workflowCache) remember(table memoTable, key string, v any) {
	if rc == nil {
		return
	}
	rc.apply()
	m := rc.settings[table]
	if m == nil || len(m) >= maxMemoKeys {
		m = map[string]any{}
		rc.settings[table] = m
	}
	m[key] = v
}

func newWorkflowCache(tls *libc.TLS, wfCol int32) *workflowCache {
	p := libc.Xcalloc(tls, 1, logSize)
	if p == 0 {
		return nil
	}
	*(*int32)(at(p + logWfCol)) = wfCol
	copy(unsafe.Slice((*byte)(at(p+logMain)), 5), "main\x00")
	return &workflowCache{open: map[string]cachedWorkflow{}, wfNodes: map[int64]string{}, wakes: newRowEntries[cachedWake](),
		cmds: newRowEntries[*cachedCommand](), nodes: newRowEntries[*cachedNode](), changes: p}
}

func (rc *workflowCache) free(tls *libc.TLS) {
	if rc != nil && rc.changes != 0 {
		libc.Xfree(tls, rc.changes)
		rc.changes = 0
	}
}

// cFunc is the C function pointer of Go function f (modernc's representation: the address of
// f's func value).
func cFunc[T any](f T) uintptr { return *(*uintptr)(unsafe.Pointer(&struct{ f T }{f})) }

// rowChanged is the writer's pre-update hook (sqlite3_preupdate_hook): it logs the rowid of a
// workflow row about to change or go, the rowid and node of a workflow inserted, the rowid of a
// wake-up row inserted, changed or deleted, the rowid of a command's or node's row about to
// change or go, and the table of a change to a row of memoTables.
func rowChanged(tls *libc.TLS, log, db uintptr, op int32, zDb, zTab uintptr, oldRow, newRow int64) {
	switch {
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
	case cStringIs(zTab, "commands"):
		// A row inserted is no entry's: an entry's row is one the cache saw inserted or read.
		if op != sqlite3.SQLITE_INSERT {
			logRow(log, tagCommandRow, oldRow)
		}
	case cStringIs(zTab, "nodes"):
		if op != sqlite3.SQLITE_INSERT {
			logRow(log, tagNodeRow, oldRow)
		}
	case cStringIs(zTab, "reconcile_queue"):
		// (The rowid alone: reading a column here copies the row, in memory SQLite allocates
		// for the call.)
		if op == sqlite3.SQLITE_INSERT {
			logRow(log, tagWakeRow, newRow)
		} else {
			logRow(log, tagWakeRow, oldRow)
		}
	default:
		for i, name := range memoTables {
			if cStringIs(zTab, name) {
				logRow(log, tagMemo, int64(i))
				return
			}
		}
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

// apply drops the entries of the nodes whose workflows the hook logged since the last call.
func (rc *workflowCache) apply() {
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
			case tagWakeRow:
				rc.wakes.dropRow(row)
			case tagCommandRow:
				rc.cmds.dropRow(row)
			case tagNodeRow:
				rc.nodes.dropRow(row)
			case tagMemo:
				if row >= 0 && row < int64(memoCount) {
					rc.settings[row] = nil
				}
			}
		}
	}
	*n, *over = 0, 0
}

// readVersion is what SQLITE_FCNTL_DATA_VERSION says of the database: a number that changes
// with every change to it, by this connection or another.
func (rc *workflowCache) readVersion(tls *libc.TLS, db uintptr) (uint32, bool) {
	if rc.changes == 0 || sqlite3.Xsqlite3_file_control(tls, db, rc.changes+logMain, sqlite3.SQLITE_FCNTL_DATA_VERSION, rc.changes+logVersion) != sqlite3.SQLITE_OK {
		return 0, false
	}
	return *(*uint32)(at(rc.changes + logVersion)), true
}

// began checks, as a transaction begins, that the database changed only through the writer's
// own commits since the cache was last true (else it empties the cache).
func (rc *workflowCache) began(tls *libc.TLS, db uintptr) {
	if v, ok := rc.readVersion(tls, db); !ok || !rc.versionKnown || v != rc.version {
		rc.clear()
	}
}

// ended records the data version a transaction's end (its commit or rollback) left.
func (rc *workflowCache) ended(tls *libc.TLS, db uintptr) {
	rc.version, rc.versionKnown = rc.readVersion(tls, db)
}

// clear empties the cache (nil: no cache).
func (rc *workflowCache) clear() {
	if rc != nil {
		rc.apply()
		rc.clearMaps()
	}
}

func (rc *workflowCache) clearMaps() {
	clear(rc.open)
	clear(rc.wfNodes)
	rc.wakes.clear()
	rc.cmds.clear()
	rc.nodes.clear()
	rc.settings = [memoCount]map[string]any{}
}

// ran takes what statement q changed; a rollback (of the transaction, or to a savepoint)
// restores rows without the hook: it empties the cache.
func (rc *workflowCache) ran(q string) {
	if strings.HasPrefix(q, "ROLLBACK") {
		rc.clear()
		return
	}
	rc.apply()
}

// workflow returns the cached open workflow of node nodeID (a copy; open false: it has none),
// and whether the cache knows it.
func (rc *workflowCache) workflow(nodeID string) (w Workflow, open, cached bool) {
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
func (rc *workflowCache) peekWorkflow(nodeID string) (cachedWorkflow, bool) {
	if rc == nil {
		return cachedWorkflow{}, false
	}
	rc.apply()
	c, ok := rc.open[nodeID]
	return c, ok
}

// putWorkflow caches w as the open workflow of its node, the row at rowid row.
func (rc *workflowCache) putWorkflow(w Workflow, row int64) {
	if rc == nil {
		return
	}
	rc.apply()
	if len(rc.open) >= maxCachedRows {
		clear(rc.open)
	}
	c := cachedWorkflow{row: row, ok: true, steps: unique.Make(w.Steps), cleanup: unique.Make(w.Cleanup)}
	w.Steps, w.Cleanup, w.CommandKinds = c.steps.Value(), c.cleanup.Value(), slices.Clone(w.CommandKinds)
	c.w = w
	rc.open[w.NodeID] = c
	rc.knowWorkflow(row, w.NodeID)
}

// putStepped caches w, what a step's update left of was, the cached row it updated (its steps
// and command kinds, which the update does not set, are was's).
func (rc *workflowCache) putStepped(was cachedWorkflow, w Workflow) {
	if rc == nil {
		return
	}
	rc.apply()
	was.w = w
	rc.open[w.NodeID] = was
}

// putNoWorkflow caches that node nodeID has no open workflow.
func (rc *workflowCache) putNoWorkflow(nodeID string) {
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
func (rc *workflowCache) knowWorkflow(row int64, nodeID string) {
	if len(rc.wfNodes) >= 4*maxCachedRows {
		clear(rc.wfNodes)
	}
	rc.wfNodes[row] = nodeID
}

// cachedWake is a node's wake-up row as SetWakeUp left or read it: due at due, no failures, not
// leased, at rowid row.
type cachedWake struct{ due, row int64 }

func (w cachedWake) rowid() int64 { return w.row }

// wake returns node nodeID's wake-up row as the cache knows it, and whether it knows it.
func (rc *workflowCache) wake(nodeID string) (cachedWake, bool) {
	if rc == nil {
		return cachedWake{}, false
	}
	rc.apply()
	return rc.wakes.get(nodeID)
}

// wakeKeeps says whether SetWakeUp's statement, run at time at for a wake-up due at due, keeps a
// row due at d with failures failed runs (not leased): one still ahead, due no later, without
// failures. Pure.
func wakeKeeps(d int64, failures int, at, due int64) bool {
	return d > at && d <= due && failures == 0
}

// putWake records that node nodeID's wake-up row, at rowid row, is due at due, without
// failures, not leased: as SetWakeUp's statement left it, or read it.
func (rc *workflowCache) putWake(nodeID string, due, row int64) {
	if rc == nil {
		return
	}
	rc.apply()
	rc.wakes.put(nodeID, cachedWake{due: due, row: row})
}

// cachedCommand is a command's row as the writer inserted, read or last changed it, at rowid row.
type cachedCommand struct {
	c   Command
	row int64
}

func (e *cachedCommand) rowid() int64 { return e.row }

// command returns the cached row of command id (a copy), and whether the cache knows it.
func (rc *workflowCache) command(id string) (Command, bool) {
	if rc == nil {
		return Command{}, false
	}
	rc.apply()
	e, ok := rc.cmds.get(id)
	rc.cmdReads.Add(1)
	if !ok {
		return Command{}, false
	}
	rc.cmdHits.Add(1)
	c := e.c
	c.ResultSig, c.SignerCert = slices.Clone(c.ResultSig), slices.Clone(c.SignerCert)
	return c, true
}

// putCommand caches c, the command's row at rowid row, as a statement of the writer just left it
// or read it.
func (rc *workflowCache) putCommand(c Command, row int64) {
	if rc == nil {
		return
	}
	c.ResultSig, c.SignerCert = slices.Clone(c.ResultSig), slices.Clone(c.SignerCert)
	rc.restoreCommand(&cachedCommand{c: c, row: row})
}

// takeCommand takes command id's entry out of the cache, for a statement that changes its row:
// the caller puts back what the statement left (restoreCommand), or nothing.
func (rc *workflowCache) takeCommand(id string) (*cachedCommand, bool) {
	if rc == nil {
		return nil, false
	}
	rc.apply()
	return rc.cmds.take(id)
}

// takeCommands is takeCommand of each of ids, by id (nil: none cached).
func (rc *workflowCache) takeCommands(ids []string) map[string]*cachedCommand {
	var out map[string]*cachedCommand
	for _, id := range ids {
		if e, ok := rc.takeCommand(id); ok {
			if out == nil {
				out = make(map[string]*cachedCommand, len(ids))
			}
			out[id] = e
		}
	}
	return out
}

// restoreCommand puts e in the cache: its row as a statement of the writer just left it (its
// slices the cache's own).
func (rc *workflowCache) restoreCommand(e *cachedCommand) {
	if rc == nil {
		return
	}
	rc.apply()
	rc.cmds.put(e.c.ID, e)
}

// restoreAssigned puts back the entry of command id taken before AssignCommands' statement
// (taken[id], if any) as the statement left it: assigned to agentID, with attempts, updated at
// at.
func (rc *workflowCache) restoreAssigned(taken map[string]*cachedCommand, id, agentID string, attempts int, at int64) {
	e, ok := taken[id]
	if !ok {
		return
	}
	delete(taken, id)
	e.c.TargetAgent, e.c.Attempts, e.c.UpdatedAt = agentID, attempts, at
	rc.restoreCommand(e)
}

// restoreUnchanged puts back the entries taken before a statement that left their rows as they
// were (taken holds what is left of them once the changed ones were restored).
func (rc *workflowCache) restoreUnchanged(taken map[string]*cachedCommand) {
	for _, e := range taken {
		rc.restoreCommand(e)
	}
}

// rowEntries holds entries by key, each the cache's copy of one row, and the key of each row by
// its rowid: a statement's change to a row, which the pre-update hook logs by rowid, drops the
// entry of that row (dropRow). It holds at most maxCachedRows entries (emptied past that).
type rowEntries[V interface{ rowid() int64 }] struct {
	byKey map[string]V
	keyOf map[int64]string
}

func newRowEntries[V interface{ rowid() int64 }]() rowEntries[V] {
	return rowEntries[V]{byKey: map[string]V{}, keyOf: map[int64]string{}}
}

func (m rowEntries[V]) get(key string) (V, bool) {
	v, ok := m.byKey[key]
	return v, ok
}

// put holds v, the row at v.rowid(), as key's entry.
func (m rowEntries[V]) put(key string, v V) {
	if len(m.byKey) >= maxCachedRows {
		m.clear()
	}
	row := v.rowid()
	if was, ok := m.byKey[key]; ok && was.rowid() != row {
		delete(m.keyOf, was.rowid())
	}
	if k, ok := m.keyOf[row]; ok && k != key {
		delete(m.byKey, k) // (not the row the cache took it for)
	}
	m.byKey[key] = v
	m.keyOf[row] = key
}

// take removes key's entry and returns it.
func (m rowEntries[V]) take(key string) (V, bool) {
	v, ok := m.byKey[key]
	if ok {
		delete(m.byKey, key)
		delete(m.keyOf, v.rowid())
	}
	return v, ok
}

// dropRow removes the entry of the row at rowid row, if one holds it.
func (m rowEntries[V]) dropRow(row int64) {
	if k, ok := m.keyOf[row]; ok {
		delete(m.keyOf, row)
		delete(m.byKey, k)
	}
}

func (m rowEntries[V]) clear() {
	clear(m.byKey)
	clear(m.keyOf)
}
