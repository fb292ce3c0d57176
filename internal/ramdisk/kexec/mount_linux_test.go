package kexec

import (
	"bcd/internal/ramdisk/looptest"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The real mounter on a real ext4 filesystem (made by mkfs.ext4 -d) on a read-only loop device;
// only the kexec syscalls are dry-run.
func TestBootRealMountExt4(t *testing.T) {
	looptest.RequireRoot(t, "mkfs.ext4")
	src := partitionDir(t, map[string]string{
		"boot/grub/grub.cfg": grubDebian, "boot/vmlinuz-6.1.0-13-amd64": "REALKERNEL", "boot/initrd.img-6.1.0-13-amd64": "REALINITRD",
	})
	img := filepath.Join(t.TempDir(), "root.ext4")
	if out, err := exec.CommandContext(t.Context(), "mkfs.ext4", "-q", "-F", "-d", src, img, "16M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	loop := looptest.Attach(t, img, true)
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
	looptest.RequireRoot(t)
	img := filepath.Join(t.TempDir(), "zeros")
	if err := os.WriteFile(img, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (SyscallMounter{}).MountReadOnly(context.Background(), looptest.Attach(t, img, true), t.TempDir()); err == nil {
		t.Fatal("mounted a device without a filesystem")
	}
}
