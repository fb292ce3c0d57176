package kexec

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Target is what to kexec: paths inside the boot partition's filesystem.
type Target struct {
	Source  string   `json:"source"` // the configuration file it came from
	Entry   Entry    `json:"entry"`
	Kernel  string   `json:"kernel"`  // resolved path in the partition (fs.FS form, no leading /)
	Initrds []string `json:"initrds"` // resolved
	Cmdline string   `json:"cmdline"`
}

// Find looks for the default boot entry in a boot partition (an ESP, a /boot partition or a root
// filesystem holding /boot): BLS entries first, then extlinux, then grub.
func Find(fsys fs.FS) (Target, error) {
	var errs []error
	for _, try := range []func(fs.FS) (Target, error){findBLS, findExtlinux, findGrub} {
		t, err := try(fsys)
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		return Target{}, errors.New("no boot loader configuration (loader/entries, extlinux.conf, syslinux.cfg, grub.cfg) found")
	}
	return Target{}, errors.Join(errs...)
}

func findBLS(fsys fs.FS) (Target, error) {
	for _, dir := range []string{"loader/entries", "boot/loader/entries"} {
		files, err := fs.Glob(fsys, dir+"/*.conf")
		if err != nil || len(files) == 0 {
			continue
		}
		var entries []Entry
		var errs []error
		for _, f := range files {
			b, err := fs.ReadFile(fsys, f)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			e, err := ParseBLS(path.Base(f), string(b))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			entries = append(entries, e)
		}
		if len(entries) == 0 {
			return Target{}, fmt.Errorf("no usable BLS entry in %s: %w", dir, errors.Join(errs...))
		}
		loaderConf, _ := fs.ReadFile(fsys, path.Join(path.Dir(dir), "loader.conf"))
		e, err := SelectBLS(entries, string(loaderConf))
		if err != nil {
			return Target{}, err
		}
		if strings.Contains(e.Cmdline, "$") {
			e.Cmdline = expandGrubenv(fsys, e.Cmdline)
		}
		// BLS paths are relative to the root of the partition holding the entries.
		root := strings.TrimSuffix(dir, "loader/entries")
		return resolve(fsys, dir+"/"+e.ID+".conf", e, root)
	}
	return Target{}, fs.ErrNotExist
}

// expandGrubenv substitutes $kernelopts (Fedora/RHEL BLS entries) from grubenv.
func expandGrubenv(fsys fs.FS, cmdline string) string {
	for _, p := range []string{"grub2/grubenv", "boot/grub2/grubenv", "grub/grubenv", "boot/grub/grubenv"} {
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			continue
		}
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "kernelopts="); ok {
				return strings.TrimSpace(strings.ReplaceAll(cmdline, "$kernelopts", v))
			}
		}
	}
	return cmdline
}

func findExtlinux(fsys fs.FS) (Target, error) {
	// syslinux's own search order (install directory aside): /boot/syslinux, /syslinux, /; the
	// EFI build also looks next to its binary (EFI/BOOT on a removable-media ESP).
	for _, p := range []string{"extlinux/extlinux.conf", "boot/extlinux/extlinux.conf", "boot/syslinux/syslinux.cfg",
		"syslinux/syslinux.cfg", "syslinux.cfg", "EFI/BOOT/syslinux.cfg", "extlinux.conf"} {
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			continue
		}
		entries, def, err := ParseExtlinux(string(b))
		if err != nil {
			return Target{}, fmt.Errorf("%s: %w", p, err)
		}
		// Relative paths are relative to the configuration file's directory.
		return resolve(fsys, p, entries[def], path.Dir(p))
	}
	return Target{}, fs.ErrNotExist
}

func findGrub(fsys fs.FS) (Target, error) {
	candidates := []string{"boot/grub/grub.cfg", "grub/grub.cfg", "boot/grub2/grub.cfg", "grub2/grub.cfg"}
	efi, _ := fs.Glob(fsys, "EFI/*/grub.cfg")
	for _, p := range append(candidates, efi...) {
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			continue
		}
		saved := ""
		if env, err := fs.ReadFile(fsys, path.Join(path.Dir(p), "grubenv")); err == nil {
			for l := range strings.Lines(string(env)) {
				if v, ok := strings.CutPrefix(strings.TrimSpace(l), "saved_entry="); ok {
					saved = v
				}
			}
		}
		_, e, err := ParseGrub(string(b), saved)
		if err != nil {
			return Target{}, fmt.Errorf("%s: %w", p, err)
		}
		if strings.HasPrefix(p, "EFI/") && !strings.Contains(string(b), "linux") {
			continue // a stub that only chains to /boot/grub/grub.cfg on another partition
		}
		return resolve(fsys, p, e, "")
	}
	return Target{}, fs.ErrNotExist
}

// resolve maps configuration paths to files in fsys: relative to base, then as absolute paths
// in the partition, then with "/boot" added or removed (the same configuration is written for a
// separate /boot partition and for /boot inside the root filesystem).
func resolve(fsys fs.FS, source string, e Entry, base string) (Target, error) {
	find := func(p string) (string, error) {
		var tries []string
		clean := strings.TrimPrefix(path.Clean("/"+p), "/")
		if !strings.HasPrefix(p, "/") && base != "" {
			tries = append(tries, path.Join(base, p))
		}
		tries = append(tries, clean)
		if rest, ok := strings.CutPrefix(clean, "boot/"); ok {
			tries = append(tries, rest)
		} else {
			tries = append(tries, path.Join("boot", clean))
		}
		for _, t := range tries {
			if st, err := fs.Stat(fsys, t); err == nil && st.Mode().IsRegular() {
				return t, nil
			}
		}
		return "", fmt.Errorf("%s names %q, which is not in the partition (tried %s)", source, p, strings.Join(tries, ", "))
	}
	t := Target{Source: source, Entry: e, Cmdline: e.Cmdline}
	var err error
	if t.Kernel, err = find(e.Kernel); err != nil {
		return Target{}, err
	}
	for _, i := range e.Initrds {
		r, err := find(i)
		if err != nil {
			return Target{}, err
		}
		t.Initrds = append(t.Initrds, r)
	}
	return t, nil
}

// Mounter mounts a partition read-only and returns how to undo it.
type Mounter interface {
	MountReadOnly(ctx context.Context, device, dir string) (unmount func() error, err error)
}

// Kexec loads a kernel and later jumps into it.
type Kexec interface {
	// Load loads kernel (+ initrds, concatenated by the caller if several) with cmdline.
	Load(ctx context.Context, kernel, initrd *os.File, cmdline string) error
	// Exec reboots into the loaded kernel; on success it does not return.
	Exec(ctx context.Context) error
}

// Rebooter is the fallback: a plain reboot through the firmware.
type Rebooter interface {
	Reboot(ctx context.Context) error
}

// Config says where the written disk is.
type Config struct {
	Disk     string // kernel name of the written disk, e.g. nvme0n1
	SysRoot  string // default /sys
	DevRoot  string // default /dev
	MountDir string // an empty directory to mount partitions on
	TempDir  string // where several initrds are concatenated; default os.TempDir()
	// Append are kernel parameters added to the target's command line (AppendArgs: each
	// replaces any of the same key), e.g. GuestArgs.
	Append []string
}

// Partitions lists the disk's partitions from sysfs in partition-number order.
func Partitions(sysRoot, disk string) ([]string, error) {
	dir := filepath.Join(cmp.Or(sysRoot, "/sys"), "class", "block", disk)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing partitions of %s: %w", disk, err)
	}
	type part struct {
		name string
		n    int
	}
	var parts []part
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "partition"))
		if err != nil {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &n); err != nil {
			continue
		}
		parts = append(parts, part{e.Name(), n})
	}
	slices.SortFunc(parts, func(a, b part) int { return cmp.Compare(a.n, b.n) })
	names := make([]string, len(parts))
	for i, p := range parts {
		names[i] = p.name
	}
	return names, nil
}

// Boot finds the default entry on the written disk, loads it and execs it. When no entry can be
// found or loaded, it logs why and reboots through the firmware instead (the disk is bootable
// either way; kexec only saves the POST). It returns only on failure of both.
func Boot(ctx context.Context, log *slog.Logger, cfg Config, m Mounter, k Kexec, r Rebooter) error {
	err := load(ctx, log, cfg, m, k)
	if err == nil {
		log.InfoContext(ctx, "kexec: jumping into the loaded kernel")
		if err = k.Exec(ctx); err == nil {
			return nil // a dry run; the real Exec does not return on success
		}
		err = fmt.Errorf("kexec exec: %w", err)
	}
	log.WarnContext(ctx, "kexec not possible, rebooting through the firmware", "err", err)
	if rerr := r.Reboot(ctx); rerr != nil {
		return errors.Join(err, fmt.Errorf("fallback reboot: %w", rerr))
	}
	return err
}

// partitionRereader is a Mounter that can make the kernel re-read a disk's partition table.
type partitionRereader interface {
	RereadPartitions(ctx context.Context, device string) error
}

func load(ctx context.Context, log *slog.Logger, cfg Config, m Mounter, k Kexec) error {
	rr, reread := m.(partitionRereader)
	var rerr error
	if reread {
		dev := filepath.Join(cmp.Or(cfg.DevRoot, "/dev"), cfg.Disk)
		if rerr = rr.RereadPartitions(ctx, dev); rerr != nil {
			log.WarnContext(ctx, "kexec: partition table not re-read", "disk", cfg.Disk, "err", rerr)
		}
	}
	parts, err := Partitions(cfg.SysRoot, cfg.Disk)
	if err != nil {
		return err
	}
	if rerr != nil && len(parts) > 0 {
		// The kernel still has the layout from before the image was written: those partitions
		// are the old ones, at the old offsets (the previous OS's, past the end of the new
		// image perhaps). What they hold is not the verified image: the firmware reboot reads
		// the table on the disk instead. (A disk that cannot be partitioned, a loop device
		// without partition scanning say, has no stale partitions: its whole-disk filesystem
		// is the image's.)
		return fmt.Errorf("the partition table of %s was not re-read after the image was written, so the partitions the kernel lists may be the old layout's: %w", cfg.Disk, rerr)
	}
	if len(parts) == 0 {
		parts = []string{cfg.Disk} // a filesystem on the whole disk
	}
	var errs []error
	for _, p := range parts {
		dev := filepath.Join(cmp.Or(cfg.DevRoot, "/dev"), p)
		// devtmpfs creates a re-read partition's node shortly after sysfs shows it.
		for deadline := time.Now().Add(2 * time.Second); reread && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if _, err := os.Stat(dev); err == nil {
				break
			}
		}
		unmount, err := m.MountReadOnly(ctx, dev, cfg.MountDir)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		t, err := Find(os.DirFS(cfg.MountDir))
		if err == nil {
			t.Cmdline = AppendArgs(t.Cmdline, cfg.Append)
			log.InfoContext(ctx, "kexec target found", "partition", p, "source", t.Source, "kernel", t.Kernel, "initrds", t.Initrds, "cmdline", t.Cmdline)
			err = loadTarget(ctx, cfg, t, k)
		}
		if uerr := unmount(); uerr != nil {
			err = errors.Join(err, fmt.Errorf("unmounting %s: %w", p, uerr))
		}
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", p, err))
	}
	return fmt.Errorf("no kexec target on %s: %w", cfg.Disk, errors.Join(errs...))
}

func loadTarget(ctx context.Context, cfg Config, t Target, k Kexec) error {
	kf, err := os.Open(filepath.Join(cfg.MountDir, filepath.FromSlash(t.Kernel)))
	if err != nil {
		return fmt.Errorf("opening the kernel: %w", err)
	}
	defer kf.Close()
	var inf *os.File
	switch len(t.Initrds) {
	case 0:
	case 1:
		if inf, err = os.Open(filepath.Join(cfg.MountDir, filepath.FromSlash(t.Initrds[0]))); err != nil {
			return fmt.Errorf("opening the initrd: %w", err)
		}
		defer inf.Close()
	default:
		// Several initrds (microcode + main) are concatenated, as boot loaders do.
		if inf, err = os.CreateTemp(cfg.TempDir, "bcd-initrd-*"); err != nil {
			return fmt.Errorf("creating the combined initrd: %w", err)
		}
		defer func() { inf.Close(); os.Remove(inf.Name()) }()
		for _, p := range t.Initrds {
			b, err := os.ReadFile(filepath.Join(cfg.MountDir, filepath.FromSlash(p)))
			if err != nil {
				return fmt.Errorf("reading initrd %s: %w", p, err)
			}
			if _, err := inf.Write(b); err != nil {
				return fmt.Errorf("combining initrds: %w", err)
			}
		}
		if _, err := inf.Seek(0, 0); err != nil {
			return fmt.Errorf("combining initrds: %w", err)
		}
	}
	if err := k.Load(ctx, kf, inf, t.Cmdline); err != nil {
		return fmt.Errorf("kexec_file_load of %s: %w", t.Kernel, err)
	}
	return nil
}
