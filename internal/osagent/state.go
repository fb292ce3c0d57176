package osagent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// State says where the agent keeps its identity across reboots.
type State interface {
	// Dir returns agentlink's data directory and a description of where it lives.
	Dir(ctx context.Context) (dir, where string, err error)
}

// Partitions lists the block devices of sysRoot that are partitions ("sda1", "vda1", …), in
// name order.
func Partitions(sysRoot string) ([]string, error) {
	dir := filepath.Join(cmp.Or(sysRoot, "/sys"), "class", "block")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing block devices: %w", err)
	}
	var out []string
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "partition")); err == nil {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out, nil
}

// MountFunc mounts device (filesystem fstype) read-write on dir.
type MountFunc func(device, dir, fstype string) error

// UnmountFunc undoes a MountFunc.
type UnmountFunc func(dir string) error

// PartitionState keeps the state on the FAT partition that carries MarkerFile (the image's
// boot partition): it mounts each partition in turn until one has the marker and returns
// MountDir/StateDir. Disks appear asynchronously after their driver loads, so it looks again
// for up to Wait.
type PartitionState struct {
	SysRoot  string // default /sys
	DevRoot  string // default /dev
	MountDir string // default /run/bcd-os
	Wait     time.Duration
	Mount    MountFunc   // default: mount(2) vfat with umask=077
	Unmount  UnmountFunc // default: umount(2)
}

// Dir implements State.
func (p PartitionState) Dir(ctx context.Context) (string, string, error) {
	mnt := cmp.Or(p.MountDir, "/run/bcd-os")
	mount, unmount := p.Mount, p.Unmount
	if mount == nil {
		mount = mountVFAT
	}
	if unmount == nil {
		unmount = func(dir string) error { return unix.Unmount(dir, 0) }
	}
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return "", "", fmt.Errorf("finding the state partition: %w", err)
	}
	deadline := time.Now().Add(p.Wait)
	var errs []error
	for {
		parts, err := Partitions(p.SysRoot)
		if err != nil {
			return "", "", err
		}
		errs = errs[:0]
		for _, part := range parts {
			dev := filepath.Join(cmp.Or(p.DevRoot, "/dev"), part)
			if err := mount(dev, mnt, "vfat"); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", part, err))
				continue
			}
			if _, err := os.Stat(filepath.Join(mnt, MarkerFile)); err == nil {
				return filepath.Join(mnt, StateDir), dev, nil
			}
			if err := unmount(mnt); err != nil {
				return "", "", fmt.Errorf("unmounting %s: %w", dev, err)
			}
		}
		if !time.Now().Before(deadline) {
			break
		}
		t := time.NewTimer(500 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", "", ctx.Err()
		case <-t.C:
		}
	}
	if len(errs) > 0 {
		return "", "", fmt.Errorf("no partition with /%s (%w)", MarkerFile, errors.Join(errs...))
	}
	return "", "", fmt.Errorf("no partition with /%s", MarkerFile)
}

func mountVFAT(device, dir, fstype string) error {
	err := unix.Mount(device, dir, fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_NOATIME, "umask=077")
	if err != nil {
		return fmt.Errorf("mount %s: %w", fstype, err)
	}
	return nil
}

// DirState is a fixed directory (tests, or an OS with a writable root).
type DirState string

// Dir implements State.
func (d DirState) Dir(context.Context) (string, string, error) {
	if strings.TrimSpace(string(d)) == "" {
		return "", "", errors.New("no state directory")
	}
	if err := os.MkdirAll(string(d), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", "", err
	}
	return string(d), string(d), nil
}
