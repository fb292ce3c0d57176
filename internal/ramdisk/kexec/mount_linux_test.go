package kexec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func requireRoot(t *testing.T, tools ...string) {
	t.Helper()
	msg := ""
	if os.Geteuid() != 0 {
		msg = "needs root"
	} else if _, err := os.Stat("/dev/loop-control"); err != nil {
		msg = "needs /dev/loop-control"
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil && msg == "" {
			msg = "needs " + tool + " (Debian e2fsprogs)"
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

// attachLoop attaches backing to a free loop device and returns its path (node created in a
// temp dir when /dev lacks it); detached at cleanup.
func attachLoop(t *testing.T, backing string) string {
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
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_READ_ONLY
		if err := unix.IoctlLoopConfigure(int(l.Fd()), &cfg); errors.Is(err, unix.EBUSY) {
			l.Close()
			continue
		} else if err != nil {
			l.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.IoctlSetInt(int(l.Fd()), unix.LOOP_CLR_FD, 0); l.Close() })
		return path
	}
	t.Fatal("no free loop device")
	return ""
}

// The real mounter on a real ext4 filesystem (made by mkfs.ext4 -d) on a read-only loop device;
// only the kexec syscalls are dry-run.
func TestBootRealMountExt4(t *testing.T) {
	requireRoot(t, "mkfs.ext4")
	src := partitionDir(t, map[string]string{
		"boot/grub/grub.cfg": grubDebian, "boot/vmlinuz-6.1.0-13-amd64": "REALKERNEL", "boot/initrd.img-6.1.0-13-amd64": "REALINITRD",
	})
	img := filepath.Join(t.TempDir(), "root.ext4")
	if out, err := exec.CommandContext(t.Context(), "mkfs.ext4", "-q", "-F", "-d", src, img, "16M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	loop := attachLoop(t, img)
	name := filepath.Base(loop)
	cfg := Config{Disk: name, SysRoot: "/sys", DevRoot: filepath.Dir(loop), MountDir: t.TempDir()}
	d := &DryRun{}
	if err := Boot(context.Background(), slog.New(slog.DiscardHandler), cfg, SyscallMounter{}, d, d); err != nil {
		t.Fatal(err)
	}
	if len(d.Loaded) != 1 || string(d.Loaded[0].Kernel) != "REALKERNEL" || string(d.Loaded[0].Initrd) != "REALINITRD" || d.Execs != 1 || d.Reboots != 0 {
		t.Fatalf("loaded %+v execs %d reboots %d", d.Loaded, d.Execs, d.Reboots)
	}
	if ents, err := os.ReadDir(cfg.MountDir); err != nil || len(ents) != 0 {
		t.Errorf("the partition is still mounted: %v %v", ents, err)
	}
}

func TestSyscallMounterRefusesGarbage(t *testing.T) {
	requireRoot(t)
	img := filepath.Join(t.TempDir(), "zeros")
	if err := os.WriteFile(img, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (SyscallMounter{}).MountReadOnly(context.Background(), attachLoop(t, img), t.TempDir()); err == nil {
		t.Fatal("mounted a device without a filesystem")
	}
}
