package store

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data, and what reading it back needs of its metadata (its size), to
// disk, as SQLite's own syncs do on Linux.
func fdatasync(f *os.File) error { return syscall.Fdatasync(int(f.Fd())) }
