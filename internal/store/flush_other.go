//go:build !linux

package store

import "os"

// fdatasync flushes f to disk (fsync: fdatasync is Linux's).
func fdatasync(f *os.File) error { return f.Sync() }
