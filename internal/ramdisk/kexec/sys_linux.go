package kexec

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// SyscallKexec is the real Kexec: kexec_file_load(2) and reboot(LINUX_REBOOT_CMD_KEXEC).
type SyscallKexec struct{}

// Load implements Kexec.
func (SyscallKexec) Load(_ context.Context, kernel, initrd *os.File, cmdline string) error {
	ifd, flags := -1, 0
	if initrd != nil {
		ifd = int(initrd.Fd())
	} else {
		flags |= unix.KEXEC_FILE_NO_INITRAMFS
	}
	if err := unix.KexecFileLoad(int(kernel.Fd()), ifd, cmdline, flags); err != nil {
		return fmt.Errorf("kexec_file_load: %w", err)
	}
	return nil
}

// Exec implements Kexec.
func (SyscallKexec) Exec(context.Context) error {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_KEXEC); err != nil {
		return fmt.Errorf("reboot(KEXEC): %w", err)
	}
	return nil
}

// SyscallRebooter reboots through the firmware.
type SyscallRebooter struct{}

// Reboot implements Rebooter.
func (SyscallRebooter) Reboot(context.Context) error {
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART); err != nil {
		return fmt.Errorf("reboot(RESTART): %w", err)
	}
	return nil
}

// SyscallMounter mounts read-only, trying the filesystems a boot partition uses.
type SyscallMounter struct{}

// RereadPartitions asks the kernel to re-read device's partition table (BLKRRPART): the image
// just written brought a new one, which the kernel does not see by itself.
func (SyscallMounter) RereadPartitions(_ context.Context, device string) error {
	f, err := os.Open(device)
	if err != nil {
		return fmt.Errorf("opening %s: %w", device, err)
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0); err != nil {
		return fmt.Errorf("re-reading the partition table of %s: %w", device, err)
	}
	return nil
}

// Filesystems tried, in order.
func bootFilesystems() []string { return []string{"vfat", "ext4", "xfs", "btrfs"} }

// MountReadOnly implements Mounter.
func (SyscallMounter) MountReadOnly(_ context.Context, device, dir string) (func() error, error) {
	var errs []error
	for _, fstype := range bootFilesystems() {
		err := unix.Mount(device, dir, fstype, unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		if err == nil {
			return func() error {
				if err := unix.Unmount(dir, 0); err != nil {
					return fmt.Errorf("unmounting %s: %w", dir, err)
				}
				return nil
			}, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", fstype, err))
	}
	return nil, fmt.Errorf("mounting %s read-only: %w", device, errors.Join(errs...))
}

// DryRun records what would be done; tests and `--dry-run` use it for every interface.
type DryRun struct {
	mu       sync.Mutex
	Loaded   []DryRunLoad
	Execs    int
	Reboots  int
	LoadErr  error // returned by Load when set
	ExecErr  error
	MountDir map[string]string // device → directory whose contents stand in for the partition
}

// DryRunLoad is one recorded Load.
type DryRunLoad struct {
	Kernel  []byte
	Initrd  []byte
	Cmdline string
}

// Load implements Kexec.
func (d *DryRun) Load(_ context.Context, kernel, initrd *os.File, cmdline string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.LoadErr != nil {
		return d.LoadErr
	}
	l := DryRunLoad{Cmdline: cmdline}
	var err error
	if l.Kernel, err = readAll(kernel); err != nil {
		return err
	}
	if initrd != nil {
		if l.Initrd, err = readAll(initrd); err != nil {
			return err
		}
	}
	d.Loaded = append(d.Loaded, l)
	return nil
}

func readAll(f *os.File) ([]byte, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	b := make([]byte, st.Size())
	_, err = f.ReadAt(b, 0)
	return b, err
}

// Exec implements Kexec.
func (d *DryRun) Exec(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.Execs++
	return d.ExecErr
}

// Reboot implements Rebooter.
func (d *DryRun) Reboot(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.Reboots++
	return nil
}

// MountReadOnly implements Mounter by copying the directory standing in for device into dir;
// the returned function empties dir again.
func (d *DryRun) MountReadOnly(_ context.Context, device, dir string) (func() error, error) {
	src, ok := d.MountDir[device]
	if !ok {
		return nil, fmt.Errorf("dry run: %s has no filesystem", device)
	}
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		return nil, fmt.Errorf("dry run: populating %s: %w", dir, err)
	}
	return func() error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := os.RemoveAll(dir + "/" + e.Name()); err != nil {
				return err
			}
		}
		return nil
	}, nil
}
