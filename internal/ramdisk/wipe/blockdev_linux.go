package wipe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
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
	relock   func() error // puts an eMMC boot partition's force_ro back; nil when not changed
}

// OpenOptions configure Open.
type OpenOptions struct {
	SysRoot  string // default /sys
	NoDirect bool   // never use O_DIRECT
	// UnlockBootPartitions makes an eMMC hardware boot partition (mmcblkNbootM), which the
	// kernel keeps read-only (force_ro = 1), writable while it is open: force_ro is set to 0
	// before the open, and put back by Close, or at once when the open fails. The wipe's
	// LinuxOpener sets it: boot partitions hold the previous tenant's boot firmware.
	UnlockBootPartitions bool
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
	if d.block && opts.UnlockBootPartitions && IsEMMCBootPartition(d.name) {
		if d.relock, err = unlockBootPartition(d.sysRoot, d.name); err != nil {
			return nil, fmt.Errorf("opening %s: %w", path, err)
		}
	}
	if d.buffered, err = os.OpenFile(path, flags, 0); err != nil {
		return nil, errors.Join(fmt.Errorf("opening %s: %w", path, err), d.Close())
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
			return nil, errors.Join(fmt.Errorf("reading the size of %s: %w", path, e), d.Close())
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

// Close closes both descriptors and makes an eMMC boot partition Open unlocked read-only again.
func (d *BlockDevice) Close() error {
	var errs []error
	if d.direct != nil {
		errs = append(errs, d.direct.Close())
	}
	if d.buffered != nil {
		errs = append(errs, d.buffered.Close())
	}
	if d.relock != nil {
		errs = append(errs, d.relock())
		d.relock = nil
	}
	return errors.Join(errs...)
}

// IsEMMCBootPartition reports whether name is an eMMC hardware boot partition (mmcblk0boot0,
// mmcblk0boot1): a disk of its own in /sys/block, beside the user area (mmcblk0), that the
// kernel keeps read-only unless its force_ro attribute is set to 0.
func IsEMMCBootPartition(name string) bool {
	rest, ok := strings.CutPrefix(name, "mmcblk")
	if !ok {
		return false
	}
	dev, part, ok := strings.Cut(rest, "boot")
	return ok && isDigits(dev) && isDigits(part)
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// unlockBootPartition sets the force_ro attribute of eMMC boot partition name to 0 and returns
// what puts back the value it had. Without the attribute there is nothing to unlock (the open
// says whether the device is writable). A partition that stays read-only (its ro attribute)
// is write-protected by the eMMC itself (power-on or permanent boot area protection, which
// force_ro does not lift): that fails, force_ro put back.
func unlockBootPartition(sysRoot, name string) (relock func() error, err error) {
	dir := filepath.Join(sysRoot, "class", "block", name)
	attr := filepath.Join(dir, "force_ro")
	b, err := os.ReadFile(attr)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", attr, err)
	}
	old := strings.TrimSpace(string(b))
	if old == "0" {
		return nil, nil
	}
	if err := writeAttr(attr, "0"); err != nil {
		return nil, fmt.Errorf("making eMMC boot partition %s writable (force_ro = 0): %w", name, err)
	}
	relock = func() error {
		if err := writeAttr(attr, old); err != nil {
			return fmt.Errorf("making eMMC boot partition %s read-only again (force_ro = %s): %w", name, old, err)
		}
		return nil
	}
	if ro, err := os.ReadFile(filepath.Join(dir, "ro")); err == nil && strings.TrimSpace(string(ro)) == "1" {
		return nil, errors.Join(fmt.Errorf("eMMC boot partition %s stays read-only with force_ro = 0: the eMMC write-protects its boot area (see %s), so it cannot be wiped until that protection is lifted",
			name, filepath.Join(dir, "ro_lock_until_next_power_on")), relock())
	}
	return relock, nil
}

// writeAttr writes a sysfs attribute.
func writeAttr(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(v)
	return errors.Join(err, f.Close())
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

// DropCache drops the page cache of a block device (clean after Sync), so that reads through the
// buffered descriptor (no O_DIRECT, or an unaligned request) come from the disk, not from what
// was written. A regular file's page cache is the file: there is nothing below it to read.
func (d *BlockDevice) DropCache() error {
	if !d.block {
		return nil
	}
	if err := unix.Fadvise(int(d.buffered.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("posix_fadvise(POSIX_FADV_DONTNEED) on %s: %w", d.name, err)
	}
	return nil
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
