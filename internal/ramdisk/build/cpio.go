package build

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strconv"
	"strings"
)

// File types of a newc cpio entry (the S_IFMT bits of its mode).
const (
	TypeDir     uint32 = 0o040000
	TypeRegular uint32 = 0o100000
	TypeSymlink uint32 = 0o120000
	TypeCharDev uint32 = 0o020000

	typeMask = 0o170000
)

const (
	newcMagic   = "070701"
	trailerName = "TRAILER!!!"
	headerLen   = 110
)

// Entry is one file of an archive. Mode holds the type bits and the permission bits; Data is
// the content of a regular file or the target of a symlink; Major/Minor name a device node.
type Entry struct {
	Name         string
	Mode         uint32
	Data         []byte
	Major, Minor uint32
}

func (e Entry) typ() uint32 { return e.Mode & typeMask }

// Archive collects entries and writes them as a deterministic newc cpio: entries sorted by
// name, every parent directory present, owner root, mtime fixed, inode numbers in order.
// The same entries always give the same bytes.
type Archive struct {
	entries map[string]Entry
	mtime   uint32
}

// NewArchive returns an empty archive whose entries all carry mtime (seconds since the epoch;
// 0 is a fine choice for reproducible builds).
func NewArchive(mtime uint32) *Archive {
	return &Archive{entries: map[string]Entry{}, mtime: mtime}
}

// AddDir adds a directory (and its parents).
func (a *Archive) AddDir(name string, perm uint32) error {
	return a.add(Entry{Name: name, Mode: TypeDir | perm&0o7777})
}

// AddFile adds a regular file (and its parent directories).
func (a *Archive) AddFile(name string, perm uint32, data []byte) error {
	return a.add(Entry{Name: name, Mode: TypeRegular | perm&0o7777, Data: data})
}

// AddSymlink adds a symbolic link to target.
func (a *Archive) AddSymlink(name, target string) error {
	if target == "" {
		return fmt.Errorf("adding symlink %s: empty target", name)
	}
	return a.add(Entry{Name: name, Mode: TypeSymlink | 0o777, Data: []byte(target)})
}

// AddCharDev adds a character device node.
func (a *Archive) AddCharDev(name string, perm, major, minor uint32) error {
	return a.add(Entry{Name: name, Mode: TypeCharDev | perm&0o7777, Major: major, Minor: minor})
}

func cleanName(name string) (string, error) {
	c := path.Clean("/" + name)
	if c == "/" {
		return "", fmt.Errorf("entry name %q names the root", name)
	}
	c = strings.TrimPrefix(c, "/")
	if c == trailerName {
		return "", fmt.Errorf("entry name %q is reserved", name)
	}
	return c, nil
}

func (a *Archive) add(e Entry) error {
	name, err := cleanName(e.Name)
	if err != nil {
		return err
	}
	e.Name = name
	if old, ok := a.entries[name]; ok {
		if old.typ() == TypeDir && e.typ() == TypeDir {
			a.entries[name] = e // an explicit directory overrides an implied one's mode
			return nil
		}
		return fmt.Errorf("adding %s: already in the archive", name)
	}
	for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
		if old, ok := a.entries[dir]; ok {
			if old.typ() != TypeDir {
				return fmt.Errorf("adding %s: parent %s is not a directory", name, dir)
			}
			continue
		}
		a.entries[dir] = Entry{Name: dir, Mode: TypeDir | 0o755}
	}
	a.entries[name] = e
	return nil
}

// Entries returns the entries in the order they are written.
func (a *Archive) Entries() []Entry {
	names := make([]string, 0, len(a.entries))
	for n := range a.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]Entry, len(names))
	for i, n := range names {
		out[i] = a.entries[n]
	}
	return out
}

// WriteTo writes the archive in newc format, trailer included.
func (a *Archive) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: bufio.NewWriterSize(w, 1<<20)}
	for i, e := range a.Entries() {
		if err := writeEntry(cw, e, uint32(i+1), a.mtime); err != nil {
			return cw.n, fmt.Errorf("writing cpio entry %s: %w", e.Name, err)
		}
	}
	if err := writeEntry(cw, Entry{Name: trailerName}, 0, 0); err != nil {
		return cw.n, fmt.Errorf("writing cpio trailer: %w", err)
	}
	if err := cw.w.(*bufio.Writer).Flush(); err != nil {
		return cw.n, fmt.Errorf("writing cpio: %w", err)
	}
	return cw.n, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func pad4(n int64) int { return int((4 - n%4) % 4) }

const padding = "\x00\x00\x00\x00"

func writeEntry(w *countWriter, e Entry, ino, mtime uint32) error {
	nlink := uint32(1)
	if e.typ() == TypeDir {
		nlink = 2
	}
	fields := [13]uint32{
		ino, e.Mode, 0, 0, nlink, mtime, uint32(len(e.Data)),
		0, 0, // dev major/minor of the archive's file system
		e.Major, e.Minor,
		uint32(len(e.Name) + 1),
		0, // check: unused by newc
	}
	var hdr bytes.Buffer
	hdr.WriteString(newcMagic)
	for _, f := range fields {
		fmt.Fprintf(&hdr, "%08x", f)
	}
	hdr.WriteString(e.Name)
	hdr.WriteByte(0)
	if _, err := w.Write(hdr.Bytes()); err != nil {
		return err
	}
	if _, err := io.WriteString(w, padding[:pad4(w.n)]); err != nil {
		return err
	}
	if _, err := w.Write(e.Data); err != nil {
		return err
	}
	_, err := io.WriteString(w, padding[:pad4(w.n)])
	return err
}

// ReadArchive parses a newc cpio stream up to its trailer. It exists for tests and for
// inspecting a built initramfs; it is strict about the format this package writes.
func ReadArchive(r io.Reader) ([]Entry, error) {
	br := &countReader{r: bufio.NewReader(r)}
	var out []Entry
	for {
		hdr := make([]byte, headerLen)
		if _, err := io.ReadFull(br, hdr); err != nil {
			return nil, fmt.Errorf("reading cpio header %d: %w", len(out), err)
		}
		if string(hdr[:6]) != newcMagic {
			return nil, fmt.Errorf("reading cpio header %d: bad magic %q", len(out), hdr[:6])
		}
		var f [13]uint32
		for i := range f {
			v, err := strconv.ParseUint(string(hdr[6+8*i:14+8*i]), 16, 32)
			if err != nil {
				return nil, fmt.Errorf("reading cpio header %d field %d: %w", len(out), i, err)
			}
			f[i] = uint32(v)
		}
		name := make([]byte, f[11])
		if _, err := io.ReadFull(br, name); err != nil {
			return nil, fmt.Errorf("reading cpio name: %w", err)
		}
		if len(name) == 0 || name[len(name)-1] != 0 {
			return nil, errors.New("reading cpio name: not NUL-terminated")
		}
		if err := br.skip(pad4(br.n)); err != nil {
			return nil, err
		}
		e := Entry{Name: string(name[:len(name)-1]), Mode: f[1], Major: f[9], Minor: f[10]}
		if e.Name == trailerName {
			return out, nil
		}
		e.Data = make([]byte, f[6])
		if _, err := io.ReadFull(br, e.Data); err != nil {
			return nil, fmt.Errorf("reading cpio data of %s: %w", e.Name, err)
		}
		if err := br.skip(pad4(br.n)); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countReader) skip(n int) error {
	if n == 0 {
		return nil
	}
	if _, err := io.ReadFull(c, make([]byte, n)); err != nil {
		return fmt.Errorf("reading cpio padding: %w", err)
	}
	return nil
}
