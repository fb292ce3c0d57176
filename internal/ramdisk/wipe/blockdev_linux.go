package wipe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BlockDevice is a disk (or, in tests, a regular file) opened for erasing and image writing.
// Aligned I/O goes through an O_DIRECT descriptor when the device allows one; unaligned I/O goes
// through a buffered one, so callers need not care.
type BlockDevice struct {
	name     string
	sysRoot  string
	direct   *os.File // nil when O_DIRECT was refused
	buffered *os.File
	size     int64
	block    bool
	lbs      int64
}

// OpenOptions configure Open.
type OpenOptions struct {
	SysRoot  string // default /sys
	NoDirect bool   // never use O_DIRECT
}

// Open opens path read-write. A block device is opened O_EXCL, so a mounted or otherwise claimed
// disk fails to open (fail closed) instead of being erased under its user.
func Open(path string, opts OpenOptions) (*BlockDevice, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	d := &BlockDevice{name: filepath.Base(path), sysRoot: cmp.Or(opts.SysRoot, "/sys"), lbs: 512}
	flags := os.O_RDWR | syscall.O_CLOEXEC
	if st.Mode()&os.ModeDevice != 0 && st.Mode()&os.ModeCharDevice == 0 {
		d.block = true
		flags |= os.O_EXCL
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("opening %s: neither a block device nor a regular file (%s)", path, st.Mode())
	}
	if d.buffered, err = os.OpenFile(path, flags, 0); err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	if !opts.NoDirect {
		// O_EXCL is already held by the buffered descriptor; a second O_EXCL open would fail.
		if f, err := os.OpenFile(path, (flags&^os.O_EXCL)|syscall.O_DIRECT, 0); err == nil {
			d.direct = f
		}
	}
	if d.block {
		fd := int(d.buffered.Fd())
		var sz uint64
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&sz))); e != 0 {
			d.Close()
			return nil, fmt.Errorf("reading the size of %s: %w", path, e)
		}
		d.size = int64(sz)
		if lbs, err := unix.IoctlGetInt(fd, unix.BLKSSZGET); err == nil && lbs > 0 {
			d.lbs = int64(lbs)
		}
	} else {
		d.size = st.Size()
	}
	return d, nil
}

// Size is the device size in bytes.
func (d *BlockDevice) Size() int64 { return d.size }

// Name is the device's base name (e.g. nvme0n1).
func (d *BlockDevice) Name() string { return d.name }

// LogicalBlockSize is the block device's logical block size; 0 for a regular file.
func (d *BlockDevice) LogicalBlockSize() int64 {
	if !d.block {
		return 0
	}
	return d.lbs
}

// Direct reports whether O_DIRECT I/O is in use.
func (d *BlockDevice) Direct() bool { return d.direct != nil }

// Close closes both descriptors.
func (d *BlockDevice) Close() error {
	var errs []error
	if d.direct != nil {
		errs = append(errs, d.direct.Close())
	}
	if d.buffered != nil {
		errs = append(errs, d.buffered.Close())
	}
	return errors.Join(errs...)
}

func (d *BlockDevice) aligned(p []byte, off int64) bool {
	a := max(d.lbs, alignment)
	return d.direct != nil && off%a == 0 && int64(len(p))%d.lbs == 0 && uintptrOf(p)%alignment == 0
}

// ReadAt reads, through the page cache only when the request is not aligned.
func (d *BlockDevice) ReadAt(p []byte, off int64) (int, error) {
	if d.aligned(p, off) {
		return d.direct.ReadAt(p, off)
	}
	return d.buffered.ReadAt(p, off)
}

// WriteAt writes, O_DIRECT when aligned.
func (d *BlockDevice) WriteAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > d.size && d.block {
		return 0, fmt.Errorf("write of %d bytes at %d beyond the end of %s (%d bytes)", len(p), off, d.name, d.size)
	}
	if d.aligned(p, off) {
		return d.direct.WriteAt(p, off)
	}
	return d.buffered.WriteAt(p, off)
}

// Sync flushes the buffered descriptor and the device's cache.
func (d *BlockDevice) Sync() error {
	if err := d.buffered.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", d.name, err)
	}
	return nil
}

func (d *BlockDevice) queueAttr(name string) int64 {
	b, err := os.ReadFile(filepath.Join(d.sysRoot, "class", "block", d.name, "queue", name))
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v
}

// Capabilities probes the device. Regular files can only be written. For NVMe and SATA disks a
// failed identify is an error: a disk that cannot be classified is not wiped by guesswork.
func (d *BlockDevice) Capabilities(ctx context.Context) (Capabilities, error) {
	if !d.block {
		return Capabilities{}, nil
	}
	c := Capabilities{
		Discard:        d.queueAttr("discard_max_bytes") > 0,
		DiscardZeroes:  d.queueAttr("discard_zeroes_data") == 1,
		ZeroOut:        true, // the kernel emulates BLKZEROOUT when the device cannot
		ZeroOutOffload: d.queueAttr("write_zeroes_max_bytes") > 0,
	}
	// BLKSECDISCARD support is not visible in sysfs; it is tried and falls through on
	// EOPNOTSUPP, which is what the fall-through is for.
	c.SecDiscard = c.Discard
	fd := int(d.buffered.Fd())
	switch {
	case strings.HasPrefix(d.name, "nvme"):
		id, err := nvmeIdentify(fd)
		if err != nil {
			return Capabilities{}, fmt.Errorf("NVMe identify on %s: %w", d.name, err)
		}
		c.NVMe = true
		c.NVMeSanitizeCrypto, c.NVMeFormatCrypto, c.ReadsZeroAfterErase = id.sanitizeCrypto, id.formatCrypto, id.deallocReadsZero
	case d.isATA():
		sec, err := ataIdentifySecurity(fd)
		if err != nil {
			return Capabilities{}, fmt.Errorf("ATA identify on %s: %w", d.name, err)
		}
		c.ATASecurity, c.ATAFrozen, c.ATAEnhancedErase = sec.supported, sec.frozen, sec.enhanced
	}
	return c, nil
}

func (d *BlockDevice) isATA() bool {
	t, err := filepath.EvalSymlinks(filepath.Join(d.sysRoot, "class", "block", d.name))
	return err == nil && strings.Contains(t, "/ata")
}

// Offload runs a device-side erase of the whole device.
func (d *BlockDevice) Offload(ctx context.Context, m Method) (string, error) {
	if !d.block {
		return "", fmt.Errorf("%s on a regular file: %w", m, ErrNotSupported)
	}
	fd := int(d.buffered.Fd())
	rng := [2]uint64{0, uint64(d.size)}
	blk := func(req uintptr) error {
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(&rng))); e != 0 {
			return ioctlErr(e)
		}
		return nil
	}
	switch m {
	case MethodZeroOut:
		return "", blk(unix.BLKZEROOUT)
	case MethodDiscard:
		return "", blk(unix.BLKDISCARD)
	case MethodSecDiscard:
		return "", blk(unix.BLKSECDISCARD)
	case MethodNVMeFormatCrypto:
		return nvmeFormatCrypto(ctx, fd)
	case MethodNVMeSanitizeCrypto:
		return nvmeSanitizeCrypto(ctx, fd)
	case MethodATASecureErase, MethodATASecureEraseStd:
		return ataSecureErase(ctx, fd, m == MethodATASecureErase)
	}
	return "", fmt.Errorf("%s: %w", m, ErrNotSupported)
}

// ioctlErr maps "this device does not do that" errnos to ErrNotSupported; everything else
// (I/O errors, permission) stops the plan.
func ioctlErr(e syscall.Errno) error {
	switch e {
	case unix.EOPNOTSUPP, unix.ENOTTY, unix.EINVAL:
		return fmt.Errorf("%w (%v)", ErrNotSupported, e)
	}
	return e
}
