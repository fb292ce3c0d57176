package store

import (
	"sync"
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// modernc's SQLite is built with SQLITE_ENABLE_MEMORY_MANAGEMENT, which puts the page caches
// of every connection in the process into one group behind one mutex: each page the writer
// fetches or releases takes it, and so does each page of every reader. In Go that mutex is a
// sync.Mutex, and a writer that finds it held parks, and then waits for a processor after the
// holder lets go: a runtime trace of a 3 000-node `bcd sim` put 2.9 s of the writer's 17.5 s
// inside its groups in that wait, about 3 ms at a time (session 40; 1.1 s of 13.1 s of waits on
// any mutex with the caches separate).
//
// SQLite's own default in a threadsafe build without that option is a group for each cache
// (pcache1.separateCache), which needs no lock: a connection is used by one goroutine at a
// time. The switch is not reachable through sqlite3_config, so the store sets it in pcache1's
// global state itself (pinned to the modernc.org/sqlite of go.mod; the symbol's type is the
// library's own, and a renamed symbol fails the link). A cache joins the group the switch
// says when it is created, so the store sets it before its first connection opens; caches
// already in the shared group stay there, and work as before. What the shared group allows
// and separate caches do not: sqlite3_release_memory and a soft heap limit reclaiming other
// connections' pages. The store uses neither.
//
//go:linkname sqlitePageCaches modernc.org/sqlite/lib._pcache1_g
var sqlitePageCaches sqlite3.TPCacheGlobal

// pageCachesSeparated guards the one write to pcache1's state: it is the process's, as the
// library's configuration is.
var pageCachesSeparated sync.Once

// separatePageCaches gives every SQLite page cache created from now on a group of its own, and
// puts rekeyPage between SQLite and pcache1's page renumbering.
func separatePageCaches() {
	pageCachesSeparated.Do(func() {
		tls := libc.NewTLS()
		defer tls.Close()
		// pcache1's state is set (and its switch cleared) when SQLite initialises: first.
		// (If it fails, so does every connection after it, with SQLite's error.)
		if sqlite3.Xsqlite3_initialize(tls) == sqlite3.SQLITE_OK {
			sqlitePageCaches.FseparateCache = 1
			pcacheRekey = sqliteConfig.Fpcache2.FxRekey
			*(*func(*libc.TLS, uintptr, uintptr, uint32, uint32))(unsafe.Pointer(&sqliteConfig.Fpcache2.FxRekey)) = rekeyPage
		}
	})
}

// When a page splits, SQLite puts the new sibling pages in ascending order by swapping their
// numbers, and parks one page at a temporary number while it does: the page of the lock byte
// (the page at 1 GiB, 262 145 with 4 KiB pages), which is never a page of a database. pcache1
// raises the cache's largest number (iMaxKey) to it and keeps it there. At the end of every
// write transaction the pager drops the pages past the database's end from its cache, and a
// cache whose largest number lies that far past the end (a database under 1 GiB) is searched
// slot by slot: the writer's 16 MiB cache, 4 096 pages and their hash table, at every commit
// that followed a split (a third of them), 0.22 s of the writer's 9 s at 3 000 simulated nodes.
//
// rekeyPage renumbers as pcache1 does, and a move to the temporary number leaves the cache's
// largest number as it was: SQLite moves the page on to its final number in its next
// renumbering but one, with nothing between them that reads the bound, and that number was a
// page's before the swap. A truncation then finds nothing past the end and searches nothing.
// pcache1's other uses of the bound are unchanged; so is every renumbering to another number.
//
//go:linkname sqliteConfig modernc.org/sqlite/lib._sqlite3Config
var sqliteConfig sqlite3.TSqlite3Config

//go:linkname sqlitePendingByte modernc.org/sqlite/lib._sqlite3PendingByte
var sqlitePendingByte int32

// pcacheRekey is pcache1's renumbering (xRekey), which rekeyPage calls.
var pcacheRekey uintptr

// rekeyPage is pcache1's xRekey of page (a PgHdr1) in cache p (a PCache1) from number from to
// to, except that a move to the temporary number of a page split does not raise the cache's
// largest number.
func rekeyPage(tls *libc.TLS, p, page uintptr, from, to uint32) {
	c := (*sqlite3.TPCache1)(at(p))
	bound := c.FiMaxKey
	(*(*func(*libc.TLS, uintptr, uintptr, uint32, uint32))(unsafe.Pointer(&pcacheRekey)))(tls, p, page, from, to)
	if c.FszPage > 0 && to == splitSwapPage(sqlitePendingByte, c.FszPage) && bound < to {
		c.FiMaxKey = bound
	}
}

// splitSwapPage is the temporary number SQLite gives a page while a split swaps its siblings'
// numbers: the page holding the lock byte at offset pendingByte, with pages of pageSize bytes.
// Pure.
func splitSwapPage(pendingByte, pageSize int32) uint32 {
	return uint32(pendingByte)/uint32(pageSize) + 1
}
