package store

import (
	"sync"
	_ "unsafe" // go:linkname, below

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

// separatePageCaches gives every SQLite page cache created from now on a group of its own.
func separatePageCaches() {
	pageCachesSeparated.Do(func() {
		tls := libc.NewTLS()
		defer tls.Close()
		// pcache1's state is set (and its switch cleared) when SQLite initialises: first.
		// (If it fails, so does every connection after it, with SQLite's error.)
		if sqlite3.Xsqlite3_initialize(tls) == sqlite3.SQLITE_OK {
			sqlitePageCaches.FseparateCache = 1
		}
	})
}
