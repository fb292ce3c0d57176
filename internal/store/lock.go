package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// LockSQLite takes the lock that lets one server at a time run on an SQLite store: an exclusive
// flock on PATH.lock, held until the returned file is closed or the process ends (a crash leaves
// no stale lock). A second server on the same file would reconcile the same nodes and send the
// same commands: the engine's SQLite paths rely on being the only writer. The lock file names
// its holder. For PostgreSQL, which servers share, it returns nil and no error.
func LockSQLite(dsn string) (io.Closer, error) {
	engine, target, err := ParseDSN(dsn)
	if err != nil || engine != SQLite {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
		return nil, fmt.Errorf("creating store directory: %w", err)
	}
	path := target + ".lock"
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the SQLite store's lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(io.LimitReader(f, 256))
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("the SQLite store %s is in use by another bcd server (%s): an SQLite store serves one server at a time; servers that share a store need PostgreSQL",
				target, strings.TrimSpace(string(holder)))
		}
		return nil, fmt.Errorf("locking the SQLite store %s: %w", target, err)
	}
	if err := f.Truncate(0); err == nil {
		fmt.Fprintf(f, "pid %d, since %s\n", os.Getpid(), time.Now().UTC().Format(time.RFC3339))
	}
	return f, nil
}
