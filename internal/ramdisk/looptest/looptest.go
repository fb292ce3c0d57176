//go:build linux

// Package looptest gives the ramdisk packages' root tests real block devices: loop devices over
// files the test made (LOOP_CONFIGURE, no losetup), detached when the test ends.
package looptest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// RequireRoot skips the test without root, /dev/loop-control or one of tools; under CI=true
// it fails instead, so CI never silently skips a root test.
func RequireRoot(t testing.TB, tools ...string) {
	t.Helper()
	msg := ""
	if os.Geteuid() != 0 {
		msg = "needs root"
	} else if _, err := os.Stat("/dev/loop-control"); err != nil {
		msg = "needs /dev/loop-control (loop devices)"
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil && msg == "" {
			msg = "needs " + tool
		}
	}
	if msg == "" {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: %s", msg)
	}
	t.Skip(msg)
}

// Attach attaches backing to a free loop device and returns its path (the device node is made
// in the test's temp dir when /dev lacks it). It is detached at cleanup.
func Attach(t testing.TB, backing string, readOnly bool) string {
	t.Helper()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	f, err := os.OpenFile(backing, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 10 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			t.Fatal(err)
		}
		path := fmt.Sprintf("/dev/loop%d", n)
		if _, err := os.Stat(path); err != nil {
			path = filepath.Join(t.TempDir(), fmt.Sprintf("loop%d", n))
			if err := unix.Mknod(path, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil {
				t.Fatal(err)
			}
		}
		l, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		cfg := unix.LoopConfig{Fd: uint32(f.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		if readOnly {
			cfg.Info.Flags |= unix.LO_FLAGS_READ_ONLY
		}
		err = unix.IoctlLoopConfigure(int(l.Fd()), &cfg)
		if errors.Is(err, unix.EBUSY) { // raced another process for this loop device
			l.Close()
			continue
		}
		if err != nil {
			l.Close()
			t.Fatalf("LOOP_CONFIGURE %s: %v", path, err)
		}
		t.Cleanup(func() {
			_ = unix.IoctlSetInt(int(l.Fd()), unix.LOOP_CLR_FD, 0)
			l.Close()
		})
		return path
	}
	t.Fatal("no free loop device after 10 tries")
	return ""
}
