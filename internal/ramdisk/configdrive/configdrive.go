package configdrive

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
)

// File is one file of the drive.
type File struct {
	// Name is its path from the root directory, e.g. "user-data" or
	// "openstack/latest/meta_data.json": at most 8 parts separated by '/', each 1–64 chars of
	// [A-Za-z0-9._-], not starting or ending with '.'. The directories are made as needed.
	Name string
	Data []byte
}

// Disk is the whole disk device (or an image file), opened read-write.
type Disk interface {
	io.ReaderAt
	io.WriterAt
}

// Options tune Write. Zero values take the defaults.
type Options struct {
	Label string // filesystem label, default "CIDATA" (≤ 11 chars, upper-cased unless LabelAsGiven)
	// LabelAsGiven writes Label with its lower-case letters kept: OpenStack's "config-2", which
	// Ignition finds by that exact label (cloud-init by either case).
	LabelAsGiven bool
	Size         int64 // partition size in bytes, default DefaultSize (16 MiB); a multiple of 1 MiB, ≥ 8 MiB
	SectorSize   int   // the disk's logical sector size: 512 (default) or 4096
}

// DefaultSize is the size of a new config-drive partition when Options.Size is 0.
const DefaultSize = 16 << 20

// DefaultLabel is the filesystem label when Options.Label is empty: what cloud-init's NoCloud
// data source looks for.
const DefaultLabel = "CIDATA"

// OpenStackLabel is the label of an OpenStack config drive (written with LabelAsGiven), whose
// files are under openstack/latest/: what cloud-init's ConfigDrive data source, cloudbase-init
// and Ignition's OpenStack provider look for.
const OpenStackLabel = "config-2"

const (
	mib          = 1 << 20
	minSize      = 8 * mib
	maxFileData  = 1 * mib // all files together
	maxNameLen   = 64
	maxDepth     = 8
	maxLabelLen  = 11
	gptPartName  = "config-drive"
	tableGPT     = "gpt"
	tableMBR     = "mbr"
	sectorSize4K = 4096
)

// Result says what Write did.
type Result struct {
	Table     string            `json:"table"`     // "gpt" or "mbr"
	Partition int               `json:"partition"` // 1-based partition number, as the kernel names it (sda2 → 2)
	Start     int64             `json:"start"`     // bytes from the disk's start
	Size      int64             `json:"size"`      // bytes
	Label     string            `json:"label"`
	Reused    bool              `json:"reused"` // an existing config-drive partition was rewritten, none added
	Files     map[string]string `json:"files"`  // name → hex SHA-256 of the data written
}

// Write adds (or reuses) the config-drive partition on d (diskSize bytes long), writes the FAT
// filesystem with files into it, and reads back what it wrote before returning.
func Write(d Disk, diskSize int64, files []File, o Options) (Result, error) {
	o, err := o.withDefaults()
	if err != nil {
		return Result{}, err
	}
	if err := checkFiles(files); err != nil {
		return Result{}, err
	}
	t, err := readTable(d, diskSize, o.SectorSize)
	if err != nil {
		return Result{}, err
	}
	p, found, err := t.findDrive(d, o.Label)
	if err != nil {
		return Result{}, err
	}
	if !found {
		if p, err = t.plan(o.Size); err != nil {
			return Result{}, err
		}
	}
	start, size := p.first*int64(t.ss), (p.last-p.first+1)*int64(t.ss)
	g, err := fatLayout(size, t.ss)
	if err != nil {
		return Result{}, fmt.Errorf("config drive: partition %d (%d bytes at byte %d): %w", p.index+1, size, start, err)
	}
	hidden := uint32(0)
	if p.first <= 0xFFFFFFFF {
		hidden = uint32(p.first)
	}
	head, err := buildFAT(g, o.Label, hidden, files)
	if err != nil {
		return Result{}, err
	}
	// Nothing is written before this point: a refusal leaves the disk as it was.
	rec := &recorder{d: d}
	if !found {
		if err := t.clearOldBackup(rec); err != nil {
			return Result{}, err
		}
	}
	if err := rec.write("filesystem head", start, head); err != nil {
		return Result{}, err
	}
	if tail := max(size-mib, int64(len(head))); tail < size {
		if err := rec.write("filesystem tail (zeros)", start+tail, make([]byte, size-tail)); err != nil {
			return Result{}, err
		}
	}
	if !found {
		if err := t.commit(p, rec); err != nil {
			return Result{}, err
		}
	}
	if err := rec.verify(); err != nil {
		return Result{}, err
	}
	r := Result{
		Table:     t.kind,
		Partition: p.index + 1,
		Start:     start,
		Size:      size,
		Label:     o.Label,
		Reused:    found,
		Files:     make(map[string]string, len(files)),
	}
	for _, f := range files {
		sum := sha256.Sum256(f.Data)
		r.Files[f.Name] = hex.EncodeToString(sum[:])
	}
	return r, nil
}

// Find locates an existing config drive labelled DefaultLabel (MBR) or named "config-drive"
// (GPT) on d. Result.Label is the label in the partition's FAT boot sector ("" if it holds
// none); Files is nil (Find does not read the filesystem). found is false when the disk has a
// partition table but no config drive; a disk without a readable partition table is an error.
func Find(d Disk, diskSize int64, sectorSize int) (r Result, found bool, err error) {
	o, err := Options{SectorSize: sectorSize}.withDefaults()
	if err != nil {
		return Result{}, false, err
	}
	t, err := readTable(d, diskSize, o.SectorSize)
	if err != nil {
		return Result{}, false, err
	}
	p, found, err := t.findDrive(d, o.Label)
	if err != nil || !found {
		return Result{}, false, err
	}
	label, _ := readFATLabel(d, p.first*int64(t.ss), t.ss)
	return Result{
		Table:     t.kind,
		Partition: p.index + 1,
		Start:     p.first * int64(t.ss),
		Size:      (p.last - p.first + 1) * int64(t.ss),
		Label:     label,
	}, true, nil
}

func (o Options) withDefaults() (Options, error) {
	if o.Label == "" {
		o.Label = DefaultLabel
	}
	if !o.LabelAsGiven {
		o.Label = strings.ToUpper(o.Label)
	}
	if len(o.Label) > maxLabelLen {
		return o, fmt.Errorf("config drive: label %q: at most %d characters", o.Label, maxLabelLen)
	}
	for _, c := range o.Label {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return o, fmt.Errorf("config drive: label %q: labels use letters, digits, '_', '-'", o.Label)
		}
	}
	if o.Size == 0 {
		o.Size = DefaultSize
	}
	if o.Size < minSize || o.Size%mib != 0 {
		return o, fmt.Errorf("config drive: size %d bytes: a multiple of 1 MiB (1048576), at least 8 MiB, is accepted", o.Size)
	}
	if o.SectorSize == 0 {
		o.SectorSize = 512
	}
	if o.SectorSize != 512 && o.SectorSize != sectorSize4K {
		return o, fmt.Errorf("config drive: sector size %d: 512 or 4096 is accepted", o.SectorSize)
	}
	return o, nil
}

func checkFiles(files []File) error {
	if len(files) == 0 {
		return errors.New("config drive: no files: a config drive holds at least meta-data")
	}
	seen := make(map[string]string, len(files)) // a file's path, upper-cased → as given
	dirs := map[string]string{}                 // a directory's path, upper-cased → a file in it
	total := 0
	for _, f := range files {
		parts := strings.Split(f.Name, "/")
		if len(parts) > maxDepth {
			return fmt.Errorf("config drive: file %q: at most %d parts separated by '/' are accepted", f.Name, maxDepth)
		}
		for _, part := range parts {
			switch err := checkName(part); {
			case err != nil && len(parts) == 1:
				return fmt.Errorf("config drive: file %q: %w", f.Name, err)
			case err != nil:
				return fmt.Errorf("config drive: file %q: part %q: %w", f.Name, part, err)
			}
		}
		k := strings.ToUpper(f.Name)
		if prev, ok := seen[k]; ok {
			return fmt.Errorf("config drive: file %q: same name as %q (FAT names ignore case)", f.Name, prev)
		}
		if in, ok := dirs[k]; ok {
			return fmt.Errorf("config drive: file %q: a directory of that name holds %q", f.Name, in)
		}
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/")
			if prev, ok := seen[strings.ToUpper(d)]; ok {
				return fmt.Errorf("config drive: file %q: %q is a file, not a directory", f.Name, prev)
			}
			in, ok := dirs[strings.ToUpper(d)]
			if !ok {
				dirs[strings.ToUpper(d)] = f.Name
			} else if other := strings.Join(strings.Split(in, "/")[:i], "/"); other != d {
				return fmt.Errorf("config drive: file %q: directory %q is %q in %q (FAT names ignore case)", f.Name, d, other, in)
			}
		}
		seen[k] = f.Name
		total += len(f.Data)
	}
	if total > maxFileData {
		return fmt.Errorf("config drive: files hold %d bytes: at most %d (1 MiB) in all is accepted", total, maxFileData)
	}
	return nil
}

func checkName(n string) error {
	if n == "" || len(n) > maxNameLen {
		return fmt.Errorf("names are 1 to %d characters long", maxNameLen)
	}
	for _, c := range n {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return errors.New("names use letters, digits, '.', '_', '-'")
		}
	}
	if n[0] == '.' || n[len(n)-1] == '.' {
		return errors.New("names do not start or end with '.'")
	}
	return nil
}

// region is one write, kept for the read-back.
type region struct {
	name string
	off  int64
	data []byte
}

// recorder writes to the disk and remembers what it wrote, to read it all back at the end.
type recorder struct {
	d    Disk
	done []region
}

func (r *recorder) write(name string, off int64, data []byte) error {
	if _, err := r.d.WriteAt(data, off); err != nil {
		return fmt.Errorf("config drive: writing the %s (%d bytes at byte %d): %w", name, len(data), off, err)
	}
	r.done = append(r.done, region{name: name, off: off, data: data})
	return nil
}

// verify reads back every region written, in order; a later write over an earlier region (none
// is planned) would show as a mismatch.
func (r *recorder) verify() error {
	for _, w := range r.done {
		got, err := readAt(r.d, w.off, len(w.data))
		if err != nil {
			return fmt.Errorf("config drive: reading back the %s: %w", w.name, err)
		}
		for i := range got {
			if got[i] != w.data[i] {
				return fmt.Errorf("config drive: read-back of the %s: byte %d of it (disk byte %d) is %#02x, %#02x was written",
					w.name, i, w.off+int64(i), got[i], w.data[i])
			}
		}
	}
	return nil
}

// readAt reads exactly n bytes at off.
func readAt(d io.ReaderAt, off int64, n int) ([]byte, error) {
	b := make([]byte, n)
	m, err := d.ReadAt(b, off)
	if m == n {
		return b, nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return nil, fmt.Errorf("%d bytes at byte %d: %w", n, off, err)
}
