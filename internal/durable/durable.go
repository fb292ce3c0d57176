// Package durable writes files so that a crash or power loss leaves either the old content or
// the new one, whole: written to a temporary file beside the target, flushed, put in place by
// a rename (or a link, to create without replacing), and the directory flushed so that the
// rename lasts.
package durable

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile replaces path with b (mode perm) atomically and durably. On error path holds its
// old content or, at worst after a failed directory flush, the new content not yet durable.
func WriteFile(path string, b []byte, perm fs.FileMode) error {
	tmp, err := writeTemp(path, b, perm)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // after the rename: no such file
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replacing %s: %w", path, err)
	}
	return SyncDir(filepath.Dir(path))
}

// CreateFile creates path with b (mode perm) durably, never replacing a file already there:
// created is false, with no error, when path existed (whoever made it first wins, whole).
func CreateFile(path string, b []byte, perm fs.FileMode) (created bool, err error) {
	tmp, err := writeTemp(path, b, perm)
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("creating %s: %w", path, err)
	}
	return true, SyncDir(filepath.Dir(path))
}

// SyncDir flushes dir, so that the names created, renamed or removed in it last.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("flushing directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("flushing directory %s: %w", dir, err)
	}
	return nil
}

// writeTemp writes b, flushed, to a new temporary file beside path and returns its name.
func writeTemp(path string, b []byte, perm fs.FileMode) (string, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	_, werr := tmp.Write(b)
	merr := tmp.Chmod(perm)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, merr, serr, cerr); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("writing %s: %w", path, err)
	}
	return tmp.Name(), nil
}
