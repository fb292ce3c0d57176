package store

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"modernc.org/libc"
	"modernc.org/libc/sys/types"
	sqlite3 "modernc.org/sqlite/lib"
)

// walVFS is the SQLite writer's VFS: SQLite's own unix VFS, except that what the writer writes
// to the WAL file is collected and handed to the kernel at a commit's end, walWriteMax bytes a
// call. SQLite writes a WAL frame as two writes (its 24-byte header, then the page), so a
// commit of a hundred pages was two hundred pwrite calls, a tenth of the writer's time at
// 10 000 nodes; now it is four or five.
//
// What is collected reaches the file before anything can depend on it:
//   - before the write of a commit frame's page returns (a frame header with a database size
//     marks it; SQLite publishes the commit in the WAL index only after that write succeeds,
//     so a failed write fails the transaction as it always did);
//   - before any read, sync, truncation, size query or close of the WAL file;
//   - before any lock change or memory barrier on the WAL index (the database file's shared
//     memory), so when the writer releases its write lock nothing it wrote is held back, and
//     another connection (the readers, the checkpointer, the migrating connection) never
//     finds the file behind what it is told.
//
// A write of what was held that fails loses it (SQLite believes it written: it may be frames of
// the transaction still open), so from then on every call on the WAL file fails with that
// error: the transaction cannot commit, and neither can any after it, until the store is
// reopened, as when a flush of the WAL fails (Store.flushLoop).
//
// The VFS is registered under a name of its own (name) and used by the one connection that
// opens it by that name (the writer's); its files are SQLite's unix files, wrapped.
type walVFS struct {
	tls  *libc.TLS
	vfs  uintptr // sqlite3_vfs, C memory
	name uintptr // its name, C string
	sh   uintptr // the state its files share, C memory (the sh* offsets)
	io   [2]uintptr
}

// The shared state: the real VFS, the open WAL file (0 none), the two method tables and the
// frames written to the WAL (walVFS.frames).
const (
	shReal    = 0
	shWAL     = 8
	shPass    = 16
	shWALIO   = 24
	shFrames  = 32
	shSize    = 40
	walBufCap = 4 << 20
	// walWriteMax is the most one write hands the unix file: it writes at most 128 KiB - 1
	// bytes a call (it masks the length, as its pages are at most 64 KiB).
	walWriteMax = 124 << 10
)

// A wrapped file: its methods, the shared state, the buffer (C memory, walBufCap), the bytes it
// holds, the file offset of its first byte, whether the next write completes a commit frame,
// the error that failed a write of what it held (0 none), then SQLite's unix file.
const (
	fMethods    = 0
	fShared     = 8
	fBuf        = 16
	fLen        = 24
	fStart      = 32
	fCommitNext = 40
	fErr        = 48
	fHeader     = 56
)

// at is the memory at address p, which SQLite or modernc's allocator handed over (never Go's
// heap).
func at(p uintptr) unsafe.Pointer { return unsafe.Add(unsafe.Pointer(nil), p) }

func word(p uintptr) *uintptr { return (*uintptr)(at(p)) }

func i64(p uintptr) *int64 { return (*int64)(at(p)) }

// methods is the method table of SQLite file f.
func methods(f uintptr) *sqlite3.Tsqlite3_io_methods {
	return (*sqlite3.Tsqlite3_io_methods)(at(*word(f)))
}

// inner is the unix file a wrapped file holds.
func inner(f uintptr) uintptr { return f + fHeader }

// newWALVFS registers the VFS (as not the default) over SQLite's default one.
func newWALVFS() (*walVFS, error) {
	v := &walVFS{tls: libc.NewTLS()}
	base := sqlite3.Xsqlite3_vfs_find(v.tls, 0)
	if base == 0 {
		v.tls.Close()
		return nil, fmt.Errorf("the SQLite writer's VFS: SQLite has no default VFS")
	}
	size := unsafe.Sizeof(sqlite3.Tsqlite3_vfs{})
	iosize := unsafe.Sizeof(sqlite3.Tsqlite3_io_methods{})
	v.vfs, v.sh = libc.Xcalloc(v.tls, 1, types.Size_t(size)), libc.Xcalloc(v.tls, 1, shSize)
	v.io[0], v.io[1] = libc.Xcalloc(v.tls, 1, types.Size_t(iosize)), libc.Xcalloc(v.tls, 1, types.Size_t(iosize))
	if v.vfs == 0 || v.sh == 0 || v.io[0] == 0 || v.io[1] == 0 {
		v.free()
		return nil, fmt.Errorf("the SQLite writer's VFS: out of memory")
	}
	name, err := libc.CString(fmt.Sprintf("bcd-wal-%x", v.vfs))
	if err != nil {
		v.free()
		return nil, err
	}
	v.name = name
	*word(v.sh + shReal), *word(v.sh + shPass), *word(v.sh + shWALIO) = base, v.io[0], v.io[1]

	vfs := (*sqlite3.Tsqlite3_vfs)(at(v.vfs))
	*vfs = *(*sqlite3.Tsqlite3_vfs)(at(base))
	vfs.FszOsFile += fHeader
	vfs.FpNext, vfs.FzName, vfs.FpAppData = 0, v.name, v.sh
	*(*func(*libc.TLS, uintptr, uintptr, uintptr, int32, uintptr) int32)(unsafe.Pointer(&vfs.FxOpen)) = walVFSOpen

	for i, wal := range []bool{false, true} {
		m := (*sqlite3.Tsqlite3_io_methods)(at(v.io[i]))
		m.FiVersion = 3
		*(*func(*libc.TLS, uintptr) int32)(unsafe.Pointer(&m.FxClose)) = passClose
		*(*func(*libc.TLS, uintptr, uintptr, int32, int64) int32)(unsafe.Pointer(&m.FxRead)) = passRead
		*(*func(*libc.TLS, uintptr, uintptr, int32, int64) int32)(unsafe.Pointer(&m.FxWrite)) = passWrite
		*(*func(*libc.TLS, uintptr, int64) int32)(unsafe.Pointer(&m.FxTruncate)) = passTruncate
		*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxSync)) = passSync
		*(*func(*libc.TLS, uintptr, uintptr) int32)(unsafe.Pointer(&m.FxFileSize)) = passFileSize
		*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxLock)) = passLock
		*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxUnlock)) = passUnlock
		*(*func(*libc.TLS, uintptr, uintptr) int32)(unsafe.Pointer(&m.FxCheckReservedLock)) = passCheckReservedLock
		*(*func(*libc.TLS, uintptr, int32, uintptr) int32)(unsafe.Pointer(&m.FxFileControl)) = passFileControl
		*(*func(*libc.TLS, uintptr) int32)(unsafe.Pointer(&m.FxSectorSize)) = passSectorSize
		*(*func(*libc.TLS, uintptr) int32)(unsafe.Pointer(&m.FxDeviceCharacteristics)) = passDeviceCharacteristics
		*(*func(*libc.TLS, uintptr, int32, int32, int32, uintptr) int32)(unsafe.Pointer(&m.FxShmMap)) = passShmMap
		*(*func(*libc.TLS, uintptr, int32, int32, int32) int32)(unsafe.Pointer(&m.FxShmLock)) = passShmLock
		*(*func(*libc.TLS, uintptr))(unsafe.Pointer(&m.FxShmBarrier)) = passShmBarrier
		*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxShmUnmap)) = passShmUnmap
		*(*func(*libc.TLS, uintptr, int64, int32, uintptr) int32)(unsafe.Pointer(&m.FxFetch)) = passFetch
		*(*func(*libc.TLS, uintptr, int64, uintptr) int32)(unsafe.Pointer(&m.FxUnfetch)) = passUnfetch
		if wal {
			*(*func(*libc.TLS, uintptr) int32)(unsafe.Pointer(&m.FxClose)) = walClose
			*(*func(*libc.TLS, uintptr, uintptr, int32, int64) int32)(unsafe.Pointer(&m.FxRead)) = walRead
			*(*func(*libc.TLS, uintptr, uintptr, int32, int64) int32)(unsafe.Pointer(&m.FxWrite)) = walWrite
			*(*func(*libc.TLS, uintptr, int64) int32)(unsafe.Pointer(&m.FxTruncate)) = walTruncate
			*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxSync)) = walSync
			*(*func(*libc.TLS, uintptr, uintptr) int32)(unsafe.Pointer(&m.FxFileSize)) = walFileSize
		}
	}
	if rc := sqlite3.Xsqlite3_vfs_register(v.tls, v.vfs, 0); rc != sqlite3.SQLITE_OK {
		v.free()
		return nil, fmt.Errorf("registering the SQLite writer's VFS: code %d", rc)
	}
	return v, nil
}

// frames is the count of frames (a page each) written to the WAL through the VFS. Only the
// goroutine of the connection that writes through it may call it.
func (v *walVFS) frames() int64 { return *i64(v.sh + shFrames) }

// close unregisters the VFS: its connection must be closed first.
func (v *walVFS) close() {
	sqlite3.Xsqlite3_vfs_unregister(v.tls, v.vfs)
	v.free()
}

func (v *walVFS) free() {
	for _, p := range []uintptr{v.vfs, v.sh, v.io[0], v.io[1], v.name} {
		if p != 0 {
			libc.Xfree(v.tls, p)
		}
	}
	v.vfs, v.sh, v.io, v.name = 0, 0, [2]uintptr{}, 0
	v.tls.Close()
}

// walVFSOpen opens a file through the real VFS and wraps it: the WAL file with the buffering
// methods, any other with methods that pass each call through.
func walVFSOpen(tls *libc.TLS, pVfs, zName, f uintptr, flags int32, pOutFlags uintptr) int32 {
	sh := (*sqlite3.Tsqlite3_vfs)(at(pVfs)).FpAppData
	base := *word(sh + shReal)
	open := (*sqlite3.Tsqlite3_vfs)(at(base)).FxOpen
	rc := (*(*func(*libc.TLS, uintptr, uintptr, uintptr, int32, uintptr) int32)(unsafe.Pointer(&open)))(tls, base, zName, inner(f), flags, pOutFlags)
	if *word(inner(f)) == 0 {
		*word(f + fMethods) = 0 // not opened: SQLite will not close it
		return rc
	}
	*word(f + fShared), *word(f + fBuf), *i64(f + fLen), *i64(f + fStart), *i64(f + fCommitNext), *i64(f + fErr) = sh, 0, 0, 0, 0, 0
	if flags&sqlite3.SQLITE_OPEN_WAL != 0 {
		*word(f + fMethods) = *word(sh + shWALIO)
		*word(sh + shWAL) = f
	} else {
		*word(f + fMethods) = *word(sh + shPass)
	}
	return rc
}

// flush writes what f holds (f a wrapped WAL file). A write that fails is f's error from then
// on (walVFS).
func flush(tls *libc.TLS, f uintptr) int32 {
	n := *i64(f + fLen)
	if n == 0 {
		return sqlite3.SQLITE_OK
	}
	*i64(f + fLen) = 0
	buf, start := *word(f + fBuf), *i64(f + fStart)
	for done := int64(0); done < n; done += walWriteMax {
		if rc := passWrite(tls, f, buf+uintptr(done), int32(min(walWriteMax, n-done)), start+done); rc != sqlite3.SQLITE_OK {
			*i64(f + fErr) = int64(rc)
			return rc
		}
	}
	return sqlite3.SQLITE_OK
}

// failed is the error a write of what f held failed with (SQLITE_OK none).
func failed(f uintptr) int32 { return int32(*i64(f + fErr)) }

// settle makes the WAL file whole before a call that reads it or its size, syncs or truncates
// it: its error if a write failed, else what it holds written.
func settle(tls *libc.TLS, f uintptr) int32 {
	if rc := failed(f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return flush(tls, f)
}

// flushShared writes what the WAL file of f's connection holds. Its error has no caller to go
// to (a barrier returns nothing; a lock's caller is not writing): the WAL file's next call
// returns it (flush).
func flushShared(tls *libc.TLS, f uintptr) {
	if w := *word(*word(f + fShared) + shWAL); w != 0 {
		flush(tls, w)
	}
}

func walWrite(tls *libc.TLS, f, src uintptr, amt int32, off int64) int32 {
	if rc := failed(f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	commit := *i64(f + fCommitNext) != 0
	*i64(f + fCommitNext) = 0
	// A frame header (24 bytes) whose database size is set heads a commit frame: its page,
	// the next write, ends the commit.
	if amt == 24 {
		*i64(*word(f + fShared) + shFrames)++
		if binary.BigEndian.Uint32((*[4]byte)(at(src + 4))[:]) != 0 {
			*i64(f + fCommitNext) = 1
		}
	}
	if *word(f + fBuf) == 0 {
		if *word(f + fBuf) = libc.Xmalloc(tls, types.Size_t(walBufCap)); *word(f + fBuf) == 0 {
			return passWrite(tls, f, src, amt, off)
		}
	}
	n, start := *i64(f + fLen), *i64(f + fStart)
	if n > 0 && (off != start+n || n+int64(amt) > walBufCap || int64(amt) > walWriteMax) {
		if rc := flush(tls, f); rc != sqlite3.SQLITE_OK {
			return rc
		}
		n = 0
	}
	if int64(amt) > walWriteMax {
		return passWrite(tls, f, src, amt, off) // more than SQLite writes at once: as it is
	}
	if n == 0 {
		*i64(f + fStart) = off
	}
	libc.Xmemcpy(tls, *word(f + fBuf)+uintptr(n), src, types.Size_t(amt))
	*i64(f + fLen) = n + int64(amt)
	if commit {
		return flush(tls, f)
	}
	return sqlite3.SQLITE_OK
}

func walRead(tls *libc.TLS, f, dst uintptr, amt int32, off int64) int32 {
	if rc := settle(tls, f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return passRead(tls, f, dst, amt, off)
}

func walTruncate(tls *libc.TLS, f uintptr, size int64) int32 {
	if rc := settle(tls, f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return passTruncate(tls, f, size)
}

func walSync(tls *libc.TLS, f uintptr, flags int32) int32 {
	if rc := settle(tls, f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return passSync(tls, f, flags)
}

func walFileSize(tls *libc.TLS, f, pSize uintptr) int32 {
	if rc := settle(tls, f); rc != sqlite3.SQLITE_OK {
		return rc
	}
	return passFileSize(tls, f, pSize)
}

func walClose(tls *libc.TLS, f uintptr) int32 {
	rc := flush(tls, f)
	if b := *word(f + fBuf); b != 0 {
		libc.Xfree(tls, b)
		*word(f + fBuf) = 0
	}
	if sh := *word(f + fShared); *word(sh + shWAL) == f {
		*word(sh + shWAL) = 0
	}
	if crc := passClose(tls, f); rc == sqlite3.SQLITE_OK {
		rc = crc
	}
	return rc
}

// The calls passed through to the unix file. A method the unix file lacks (an older method
// table) answers as SQLite's callers expect of one absent.

func passClose(tls *libc.TLS, f uintptr) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr) int32)(unsafe.Pointer(&m.FxClose)))(tls, inner(f))
}

func passRead(tls *libc.TLS, f, dst uintptr, amt int32, off int64) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr, uintptr, int32, int64) int32)(unsafe.Pointer(&m.FxRead)))(tls, inner(f), dst, amt, off)
}

func passWrite(tls *libc.TLS, f, src uintptr, amt int32, off int64) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr, uintptr, int32, int64) int32)(unsafe.Pointer(&m.FxWrite)))(tls, inner(f), src, amt, off)
}

func passTruncate(tls *libc.TLS, f uintptr, size int64) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr, int64) int32)(unsafe.Pointer(&m.FxTruncate)))(tls, inner(f), size)
}

func passSync(tls *libc.TLS, f uintptr, flags int32) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxSync)))(tls, inner(f), flags)
}

func passFileSize(tls *libc.TLS, f, pSize uintptr) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr, uintptr) int32)(unsafe.Pointer(&m.FxFileSize)))(tls, inner(f), pSize)
}

func passLock(tls *libc.TLS, f uintptr, lock int32) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxLock)))(tls, inner(f), lock)
}

func passUnlock(tls *libc.TLS, f uintptr, lock int32) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxUnlock)))(tls, inner(f), lock)
}

func passCheckReservedLock(tls *libc.TLS, f, pResOut uintptr) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr, uintptr) int32)(unsafe.Pointer(&m.FxCheckReservedLock)))(tls, inner(f), pResOut)
}

func passFileControl(tls *libc.TLS, f uintptr, op int32, pArg uintptr) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr, int32, uintptr) int32)(unsafe.Pointer(&m.FxFileControl)))(tls, inner(f), op, pArg)
}

func passSectorSize(tls *libc.TLS, f uintptr) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr) int32)(unsafe.Pointer(&m.FxSectorSize)))(tls, inner(f))
}

func passDeviceCharacteristics(tls *libc.TLS, f uintptr) int32 {
	m := methods(inner(f))
	return (*(*func(*libc.TLS, uintptr) int32)(unsafe.Pointer(&m.FxDeviceCharacteristics)))(tls, inner(f))
}

func passShmMap(tls *libc.TLS, f uintptr, pg, size, extend int32, pp uintptr) int32 {
	m := methods(inner(f))
	if m.FiVersion < 2 || m.FxShmMap == 0 {
		return sqlite3.SQLITE_IOERR_SHMMAP
	}
	return (*(*func(*libc.TLS, uintptr, int32, int32, int32, uintptr) int32)(unsafe.Pointer(&m.FxShmMap)))(tls, inner(f), pg, size, extend, pp)
}

func passShmLock(tls *libc.TLS, f uintptr, off, n, flags int32) int32 {
	flushShared(tls, f)
	m := methods(inner(f))
	if m.FiVersion < 2 || m.FxShmLock == 0 {
		return sqlite3.SQLITE_IOERR_SHMLOCK
	}
	return (*(*func(*libc.TLS, uintptr, int32, int32, int32) int32)(unsafe.Pointer(&m.FxShmLock)))(tls, inner(f), off, n, flags)
}

func passShmBarrier(tls *libc.TLS, f uintptr) {
	flushShared(tls, f)
	m := methods(inner(f))
	if m.FiVersion < 2 || m.FxShmBarrier == 0 {
		return
	}
	(*(*func(*libc.TLS, uintptr))(unsafe.Pointer(&m.FxShmBarrier)))(tls, inner(f))
}

func passShmUnmap(tls *libc.TLS, f uintptr, del int32) int32 {
	m := methods(inner(f))
	if m.FiVersion < 2 || m.FxShmUnmap == 0 {
		return sqlite3.SQLITE_OK
	}
	return (*(*func(*libc.TLS, uintptr, int32) int32)(unsafe.Pointer(&m.FxShmUnmap)))(tls, inner(f), del)
}

func passFetch(tls *libc.TLS, f uintptr, off int64, amt int32, pp uintptr) int32 {
	m := methods(inner(f))
	if m.FiVersion < 3 || m.FxFetch == 0 {
		*word(pp) = 0 // no mapping: SQLite reads instead
		return sqlite3.SQLITE_OK
	}
	return (*(*func(*libc.TLS, uintptr, int64, int32, uintptr) int32)(unsafe.Pointer(&m.FxFetch)))(tls, inner(f), off, amt, pp)
}

func passUnfetch(tls *libc.TLS, f uintptr, off int64, p uintptr) int32 {
	m := methods(inner(f))
	if m.FiVersion < 3 || m.FxUnfetch == 0 {
		return sqlite3.SQLITE_OK
	}
	return (*(*func(*libc.TLS, uintptr, int64, uintptr) int32)(unsafe.Pointer(&m.FxUnfetch)))(tls, inner(f), off, p)
}
