package wipe

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"bcd/internal/ramdisk/inventory"
	"bcd/internal/ramdisk/looptest"

	"golang.org/x/sys/unix"
)

// lostTail is a loop device whose disk loses what was written to its last MiB: after the flush
// the backing file gets its old last MiB back, as a disk whose write cache lost the write (or
// that ignored it) would have.
type lostTail struct {
	*BlockDevice
	backing string
	old     []byte
}

func (d lostTail) Sync() error {
	if err := d.BlockDevice.Sync(); err != nil {
		return err
	}
	f, err := os.OpenFile(d.backing, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteAt(d.old, d.Size()-int64(len(d.old)))
	return err
}

// A real disk that did not store the zeros of its last MiB (the backup GPT) fails the
// read-back, with O_DIRECT and without it: buffered reads would find the zeros in the page
// cache, which is dropped first.
func TestReadBackLoopDeviceLostTail(t *testing.T) {
	looptest.RequireRoot(t)
	const size = 24 * mib
	for _, direct := range []bool{true, false} {
		for _, mode := range []Mode{ModeQuick, ModeFull} {
			name := string(mode) + "/buffered"
			if direct {
				name = string(mode) + "/O_DIRECT"
			}
			t.Run(name, func(t *testing.T) {
				backing := randomFile(t, size)
				b, err := os.ReadFile(backing)
				if err != nil {
					t.Fatal(err)
				}
				dev, err := Open(looptest.Attach(t, backing, false), OpenOptions{NoDirect: !direct})
				if err != nil {
					t.Fatal(err)
				}
				defer dev.Close()
				if dev.Direct() != direct {
					t.Fatalf("O_DIRECT %v, want %v", dev.Direct(), direct)
				}
				res, err := Wipe(context.Background(), testLog(), Identity{Name: "loop"}, lostTail{dev, backing, b[size-mib:]}, Request{Mode: mode, Seed: 5}, nil)
				if v := res.Verification; err == nil || res.Passed() || v.FirstNonZero < size-mib {
					t.Fatalf("the lost last MiB passed or failed elsewhere: err %v, verification %+v", err, v)
				}
			})
		}
	}
}

func TestIsEMMCBootPartition(t *testing.T) {
	for name, want := range map[string]bool{
		"mmcblk0boot0": true, "mmcblk0boot1": true, "mmcblk12boot1": true,
		"mmcblk0": false, "mmcblk0p1": false, "mmcblk0rpmb": false, "mmcblk0gp0": false,
		"mmcblkboot0": false, "mmcblk0boot": false, "mmcblk0boot0p1": false, "sda": false, "nvme0n1": false,
	} {
		if got := IsEMMCBootPartition(name); got != want {
			t.Errorf("IsEMMCBootPartition(%q) = %v", name, got)
		}
	}
}

// An eMMC boot partition, read-only by default (force_ro = 1), is wiped like any disk: the
// wipe's opener sets force_ro to 0 for the wipe and back to 1 afterwards, whether the wipe
// passed, failed or could not open the device. A temporary directory stands in for sysfs and
// a loop device, under the boot partition's name, for the partition.
func TestWipeEMMCBootPartition(t *testing.T) {
	looptest.RequireRoot(t)
	const name = "mmcblk7boot0"
	type fixture struct{ sys, node, loop, backing string }
	setup := func(t *testing.T, ro string) fixture {
		f := fixture{sys: t.TempDir(), backing: randomFile(t, 4*mib)}
		dir := filepath.Join(f.sys, "class", "block", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "force_ro"), []byte("1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if ro != "" {
			if err := os.WriteFile(filepath.Join(dir, "ro"), []byte(ro), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		f.loop = looptest.Attach(t, f.backing, false)
		var st unix.Stat_t
		if err := unix.Stat(f.loop, &st); err != nil {
			t.Fatal(err)
		}
		f.node = filepath.Join(t.TempDir(), name)
		if err := unix.Mknod(f.node, unix.S_IFBLK|0o600, int(st.Rdev)); err != nil {
			t.Fatal(err)
		}
		return f
	}
	forceRO := func(t *testing.T, f fixture) string {
		b, err := os.ReadFile(filepath.Join(f.sys, "class", "block", name, "force_ro"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	wipeAll := func(ctx context.Context, t *testing.T, f fixture, progress Progress) ([]Result, error) {
		disks := []inventory.Disk{{Name: name, Path: f.node, SizeBytes: 4 * mib}}
		return WipeAll(ctx, testLog(), disks, LinuxOpener{Options: OpenOptions{SysRoot: f.sys}}, Request{Mode: ModeFull, Seed: 2}, progress)
	}

	t.Run("wiped with force_ro 0, then 1 again", func(t *testing.T) {
		f := setup(t, "0\n")
		var during []string
		results, err := wipeAll(context.Background(), t, f, func(string, int64, int64) { during = append(during, forceRO(t, f)) })
		if err != nil || len(results) != 1 || !results[0].Passed() {
			t.Fatalf("wipe: %v %+v", err, results)
		}
		if len(during) == 0 || slices.ContainsFunc(during, func(s string) bool { return s != "0" }) {
			t.Errorf("force_ro during the wipe: %v, want 0", during)
		}
		if got := forceRO(t, f); got != "1" {
			t.Errorf("force_ro after the wipe = %s, want 1", got)
		}
		b, err := os.ReadFile(f.backing)
		if err != nil {
			t.Fatal(err)
		}
		if i := firstNonZero(b); i >= 0 {
			t.Errorf("boot partition not wiped: non-zero byte at %d", i)
		}
	})
	t.Run("the wipe fails", func(t *testing.T) {
		f := setup(t, "")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if _, err := wipeAll(ctx, t, f, func(string, int64, int64) { cancel() }); err == nil {
			t.Fatal("the cancelled wipe succeeded")
		}
		if got := forceRO(t, f); got != "1" {
			t.Errorf("force_ro after a failed wipe = %s, want 1", got)
		}
	})
	t.Run("the open fails", func(t *testing.T) {
		f := setup(t, "")
		holder, err := Open(f.loop, OpenOptions{}) // O_EXCL: the wipe's open is refused
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Close()
		results, err := wipeAll(context.Background(), t, f, nil)
		if err == nil || results[0].Passed() {
			t.Fatalf("wiped a claimed device: %v", err)
		}
		if got := forceRO(t, f); got != "1" {
			t.Errorf("force_ro after a failed open = %s, want 1", got)
		}
	})
	t.Run("boot area write-protected by the eMMC", func(t *testing.T) {
		f := setup(t, "1\n") // stays read-only with force_ro 0
		results, err := wipeAll(context.Background(), t, f, nil)
		if err == nil || results[0].Passed() || !strings.Contains(err.Error(), "stays read-only with force_ro = 0") {
			t.Fatalf("err = %v", err)
		}
		if got := forceRO(t, f); got != "1" {
			t.Errorf("force_ro = %s, want 1", got)
		}
	})
	t.Run("other opens leave force_ro alone", func(t *testing.T) {
		f := setup(t, "")
		dev, err := Open(f.node, OpenOptions{SysRoot: f.sys}) // an image target, say
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Close()
		if got := forceRO(t, f); got != "1" {
			t.Errorf("force_ro = %s after an open without UnlockBootPartitions", got)
		}
	})
}
