package store

import (
	"bytes"
	"database/sql"
	"fmt"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"modernc.org/libc"
	"modernc.org/libc/sys/types"
	sqlite3 "modernc.org/sqlite/lib"
)

// The writer's WAL writes are collected (walVFS), yet every commit is in the file, whole, when
// it returns: another connection (SQLite's own VFS, as the readers and the checkpointer use)
// reads it at once. Transactions larger than the buffer, spilled ones rolled back, and commits
// after a checkpoint restarted the WAL included; reopened afterwards, the database holds
// exactly what was committed.
func TestWALVFSCommitsReachOtherConnectionsWhole(t *testing.T) {
	path := filepath.Join(t.TempDir(), "wal.db")
	// A small page cache: large transactions spill frames to the WAL before they end.
	w, err := openLite(path, []string{"journal_mode=WAL", "synchronous=NORMAL", "wal_autocheckpoint=0", "cache_size=-256"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if _, err := w.exec(`CREATE TABLE blobs (id INTEGER PRIMARY KEY, tx INTEGER, b BLOB)`, nil); err != nil {
		t.Fatal(err)
	}
	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	blob := func(tx, i, size int) []byte { return bytes.Repeat([]byte{byte(tx*31 + i)}, size) }
	type shape struct {
		name      string
		rows      int
		size      int
		rollback  bool
		checkpost bool // a TRUNCATE checkpoint after it: the next commit restarts the WAL
	}
	shapes := []shape{
		{"one row", 1, 100, false, false},
		{"many small rows", 500, 300, false, false},
		{"larger than the buffer", 24, 256 << 10, false, false},
		{"spilled and rolled back", 40, 256 << 10, true, false},
		{"one row after a rollback", 1, 100, false, true},
		{"after the WAL restarted", 200, 4 << 10, false, false},
		{"larger than the buffer again", 20, 300 << 10, false, true},
		{"one row at the WAL's start", 1, 10, false, false},
	}
	want := map[int]int{} // tx → bytes committed
	for round := range 3 {
		for i, s := range shapes {
			tx := round*len(shapes) + i
			if _, err := w.exec("BEGIN IMMEDIATE", nil); err != nil {
				t.Fatal(err)
			}
			for r := range s.rows {
				if _, err := w.exec(`INSERT INTO blobs (tx, b) VALUES (?, ?)`, []any{tx, blob(tx, r, s.size)}); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
			}
			end := "COMMIT"
			if s.rollback {
				end = "ROLLBACK"
			} else {
				want[tx] = s.rows * s.size
			}
			if _, err := w.exec(end, nil); err != nil {
				t.Fatalf("%s: %s: %v", s.name, end, err)
			}
			// Read by the other connection as soon as the commit returned.
			var n, total int
			if err := other.QueryRow(`SELECT count(*), coalesce(sum(length(b)), 0) FROM blobs WHERE tx = ?`, tx).Scan(&n, &total); err != nil {
				t.Fatalf("%s: reading it from another connection: %v", s.name, err)
			}
			if total != want[tx] || (!s.rollback && n != s.rows) || (s.rollback && n != 0) {
				t.Fatalf("%s (round %d): another connection reads %d rows, %d bytes; want %d bytes", s.name, round, n, total, want[tx])
			}
			if s.checkpost {
				var busy, logged, moved int
				if err := other.QueryRow(`PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &logged, &moved); err != nil || busy != 0 {
					t.Fatalf("checkpoint after %s: busy %d, %v", s.name, busy, err)
				}
			}
		}
	}
	check := func(db *sql.DB, who string) {
		t.Helper()
		var ok string
		if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); err != nil || ok != "ok" {
			t.Fatalf("%s: integrity_check %q, %v", who, ok, err)
		}
		rows, err := db.Query(`SELECT tx, sum(length(b)) FROM blobs GROUP BY tx`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		got := map[int]int{}
		for rows.Next() {
			var tx, total int
			if err := rows.Scan(&tx, &total); err != nil {
				t.Fatal(err)
			}
			got[tx] = total
		}
		for tx, total := range want {
			if got[tx] != total {
				t.Errorf("%s: transaction %d holds %d bytes, want %d", who, tx, got[tx], total)
			}
		}
		if len(got) != len(want) {
			t.Errorf("%s: %d transactions hold rows, want %d", who, len(got), len(want))
		}
	}
	check(other, "another connection")
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	other.Close()
	again, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	check(again, fmt.Sprintf("reopened %s", filepath.Base(path)))
}

// A write of what the WAL file held that fails fails the write that needed it, and every call
// on the WAL file after it: frames SQLite believes written are gone, so nothing may commit.
func TestWALVFSAFailedWriteFailsEverythingAfter(t *testing.T) {
	tls := libc.NewTLS()
	defer tls.Close()
	alloc := func(n int) uintptr {
		p := libc.Xcalloc(tls, 1, types.Size_t(n))
		if p == 0 {
			t.Fatal("out of memory")
		}
		t.Cleanup(func() { libc.Xfree(tls, p) })
		return p
	}
	// A wrapped WAL file whose unix file's writes succeed until fail is set.
	io := alloc(int(unsafe.Sizeof(sqlite3.Tsqlite3_io_methods{})))
	m := (*sqlite3.Tsqlite3_io_methods)(at(io))
	m.FiVersion = 1
	fail, writes := false, 0
	write := func(_ *libc.TLS, _, _ uintptr, _ int32, _ int64) int32 {
		if fail {
			return sqlite3.SQLITE_IOERR_WRITE
		}
		writes++
		return sqlite3.SQLITE_OK
	}
	sync := func(*libc.TLS, uintptr, int32) int32 { return sqlite3.SQLITE_OK }
	// C memory hides the two from the garbage collector: they are kept alive to the end.
	defer runtime.KeepAlive(write)
	defer runtime.KeepAlive(sync)
	*(*func(*libc.TLS, uintptr, uintptr, int32, int64) int32)(unsafe.Pointer(&m.FxWrite)) = write
	*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxSync)) = sync
	sh := alloc(shSize)
	f := alloc(fHeader + 16)
	*word(f + fShared), *word(inner(f)) = sh, io
	*word(sh + shWAL) = f
	defer func() { libc.Xfree(tls, *word(f + fBuf)) }()

	page, header := alloc(4096), alloc(24)
	commitHeader := alloc(24)
	copy((*[24]byte)(at(commitHeader))[4:8], []byte{0, 0, 0, 9}) // the database's size: a commit frame
	step := func(what string, rc, want int32) {
		t.Helper()
		if rc != want {
			t.Fatalf("%s: code %d, want %d", what, rc, want)
		}
	}
	step("a frame's header", walWrite(tls, f, header, 24, 32), sqlite3.SQLITE_OK)
	step("its page", walWrite(tls, f, page, 4096, 56), sqlite3.SQLITE_OK)
	if writes != 0 {
		t.Fatalf("%d writes reached the file before the commit", writes)
	}
	step("the commit frame's header", walWrite(tls, f, commitHeader, 24, 4152), sqlite3.SQLITE_OK)
	step("the commit frame's page", walWrite(tls, f, page, 4096, 4176), sqlite3.SQLITE_OK)
	if writes != 1 {
		t.Fatalf("the commit reached the file in %d writes, want 1", writes)
	}

	// A spilled frame held when a barrier flushes and the file refuses it.
	step("a spilled frame", walWrite(tls, f, header, 24, 8272), sqlite3.SQLITE_OK)
	fail = true
	flushShared(tls, f)
	fail = false
	step("the next frame", walWrite(tls, f, page, 4096, 8296), sqlite3.SQLITE_IOERR_WRITE)
	step("the commit frame after it", walWrite(tls, f, commitHeader, 24, 12392), sqlite3.SQLITE_IOERR_WRITE)
	step("a sync", walSync(tls, f, 0), sqlite3.SQLITE_IOERR_WRITE)
}
