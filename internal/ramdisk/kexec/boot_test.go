package kexec

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
)

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

func TestFind(t *testing.T) {
	tests := []struct {
		name    string
		fs      fstest.MapFS
		want    Target
		wantErr string
	}{
		{
			name: "ESP with BLS entries and loader.conf",
			fs: fstest.MapFS{
				"loader/loader.conf":              file("default os-6.1*\n"),
				"loader/entries/os-6.1.conf":      file("title OS\nversion 6.1\nlinux /os/vmlinuz-6.1\ninitrd /os/initrd-6.1\noptions root=LABEL=r\n"),
				"loader/entries/os-6.5.conf":      file("title OS\nversion 6.5\nlinux /os/vmlinuz-6.5\noptions root=LABEL=r\n"),
				"loader/entries/broken.conf":      file("title no kernel\n"),
				"os/vmlinuz-6.1":                  file("K61"),
				"os/initrd-6.1":                   file("I61"),
				"os/vmlinuz-6.5":                  file("K65"),
				"EFI/systemd/systemd-bootx64.efi": file("MZ"),
			},
			want: Target{Source: "loader/entries/os-6.1.conf", Kernel: "os/vmlinuz-6.1", Initrds: []string{"os/initrd-6.1"}, Cmdline: "root=LABEL=r"},
		},
		{
			name: "BLS on /boot with $kernelopts",
			fs: fstest.MapFS{
				"loader/entries/f.conf": file("linux /vmlinuz\ninitrd /initramfs.img\noptions $kernelopts console=ttyS0\n"),
				"grub2/grubenv":         file("# GRUB Environment Block\nkernelopts=root=/dev/vda2 ro\n"),
				"vmlinuz":               file("K"),
				"initramfs.img":         file("I"),
			},
			want: Target{Source: "loader/entries/f.conf", Kernel: "vmlinuz", Initrds: []string{"initramfs.img"}, Cmdline: "root=/dev/vda2 ro console=ttyS0"},
		},
		{
			name: "extlinux with relative paths",
			fs: fstest.MapFS{
				"boot/extlinux/extlinux.conf": file(extlinuxConf),
				"boot/vmlinuz":                file("K"),
				"boot/ucode.img":              file("U"),
				"boot/initramfs.xz":           file("I"),
			},
			want: Target{Source: "boot/extlinux/extlinux.conf", Kernel: "boot/vmlinuz", Initrds: []string{"boot/ucode.img", "boot/initramfs.xz"}, Cmdline: "console=ttyS0 talos.platform=metal"},
		},
		{
			name: "syslinux.cfg at the root of a FAT partition (absolute paths)",
			fs: fstest.MapFS{
				"syslinux.cfg": file(syslinuxLab),
				"vmlinuz":      file("K"),
				"initrd.img":   file("I"),
			},
			want: Target{Source: "syslinux.cfg", Kernel: "vmlinuz", Initrds: []string{"initrd.img"}, Cmdline: "console=ttyS0 bcd.role=os"},
		},
		{
			name: "syslinux/syslinux.cfg (the lab OS image) next to an EFI syslinux",
			fs: fstest.MapFS{
				"syslinux/syslinux.cfg": file(syslinuxLab),
				"EFI/BOOT/BOOTX64.EFI":  file("MZ"),
				"EFI/BOOT/ldlinux.e64":  file("E"),
				"vmlinuz":               file("K"),
				"initrd.img":            file("I"),
			},
			want: Target{Source: "syslinux/syslinux.cfg", Kernel: "vmlinuz", Initrds: []string{"initrd.img"}, Cmdline: "console=ttyS0 bcd.role=os"},
		},
		{
			name: "EFI/BOOT/syslinux.cfg with paths relative to it",
			fs: fstest.MapFS{
				"EFI/BOOT/syslinux.cfg": file("DEFAULT a\nLABEL a\n LINUX vmlinuz\n APPEND initrd=initrd.img quiet\n"),
				"EFI/BOOT/vmlinuz":      file("K"),
				"EFI/BOOT/initrd.img":   file("I"),
			},
			want: Target{Source: "EFI/BOOT/syslinux.cfg", Kernel: "EFI/BOOT/vmlinuz", Initrds: []string{"EFI/BOOT/initrd.img"}, Cmdline: "quiet"},
		},
		{
			name: "grub on a separate /boot partition (paths say /boot/...)",
			fs: fstest.MapFS{
				"grub/grub.cfg":             file(grubDebian),
				"vmlinuz-6.1.0-13-amd64":    file("K"),
				"initrd.img-6.1.0-13-amd64": file("I"),
			},
			want: Target{Source: "grub/grub.cfg", Kernel: "vmlinuz-6.1.0-13-amd64", Initrds: []string{"initrd.img-6.1.0-13-amd64"}, Cmdline: "root=UUID=1234 ro quiet"},
		},
		{
			name: "grub in the root filesystem",
			fs: fstest.MapFS{
				"boot/grub/grub.cfg":             file(grubDebian),
				"boot/vmlinuz-6.1.0-13-amd64":    file("K"),
				"boot/initrd.img-6.1.0-13-amd64": file("I"),
			},
			want: Target{Source: "boot/grub/grub.cfg", Kernel: "boot/vmlinuz-6.1.0-13-amd64", Initrds: []string{"boot/initrd.img-6.1.0-13-amd64"}, Cmdline: "root=UUID=1234 ro quiet"},
		},
		{
			name:    "kernel missing",
			fs:      fstest.MapFS{"boot/grub/grub.cfg": file(grubDebian)},
			wantErr: "not in the partition",
		},
		{
			name:    "nothing",
			fs:      fstest.MapFS{"EFI/BOOT/BOOTX64.EFI": file("MZ")},
			wantErr: "no boot loader configuration",
		},
		{
			name:    "only broken BLS",
			fs:      fstest.MapFS{"loader/entries/x.conf": file("title x\n")},
			wantErr: "no usable BLS entry",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Find(tt.fs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got.Entry = Entry{}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

// sysfsWithPartitions builds /sys/class/block/<disk>/<part>/partition for the test.
func sysfsWithPartitions(t *testing.T, disk string, parts ...string) string {
	t.Helper()
	root := t.TempDir()
	for i, p := range parts {
		dir := filepath.Join(root, "class", "block", disk, p)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "partition"), []byte(strings.Repeat(" ", i)+string(rune('1'+i))+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "class", "block", disk, "queue"), 0o755); err != nil {
		t.Fatal(err)
	}
	return root
}

func partitionDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestBootDryRun(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	sys := sysfsWithPartitions(t, "vda", "vda1", "vda2")
	esp := partitionDir(t, map[string]string{"EFI/BOOT/BOOTX64.EFI": "MZ"}) // no configuration
	boot := partitionDir(t, map[string]string{
		"boot/grub/grub.cfg": grubDebian, "boot/vmlinuz-6.1.0-13-amd64": "KERNEL", "boot/initrd.img-6.1.0-13-amd64": "INITRD",
	})
	cfg := Config{Disk: "vda", SysRoot: sys, DevRoot: "/dev", MountDir: t.TempDir(), TempDir: t.TempDir()}

	t.Run("loads the default entry and execs", func(t *testing.T) {
		d := &DryRun{MountDir: map[string]string{"/dev/vda1": esp, "/dev/vda2": boot}}
		if err := Boot(context.Background(), log, cfg, d, d, d); err != nil {
			t.Fatal(err)
		}
		want := []DryRunLoad{{Kernel: []byte("KERNEL"), Initrd: []byte("INITRD"), Cmdline: "root=UUID=1234 ro quiet"}}
		if !reflect.DeepEqual(d.Loaded, want) || d.Execs != 1 || d.Reboots != 0 {
			t.Errorf("loaded %+v execs %d reboots %d", d.Loaded, d.Execs, d.Reboots)
		}
		if ents, _ := os.ReadDir(cfg.MountDir); len(ents) != 0 {
			t.Error("mount directory not cleaned up (unmount not called)")
		}
	})
	t.Run("concatenates several initrds", func(t *testing.T) {
		p := partitionDir(t, map[string]string{
			"loader/entries/a.conf": "linux /k\ninitrd /ucode\ninitrd /main\noptions x=1\n", "k": "K", "ucode": "U", "main": "M",
		})
		d := &DryRun{MountDir: map[string]string{"/dev/vda1": p}}
		if err := Boot(context.Background(), log, cfg, d, d, d); err != nil {
			t.Fatal(err)
		}
		if len(d.Loaded) != 1 || string(d.Loaded[0].Initrd) != "UM" || d.Loaded[0].Cmdline != "x=1" {
			t.Errorf("loaded %+v", d.Loaded)
		}
	})
	t.Run("no target: falls back to reboot", func(t *testing.T) {
		d := &DryRun{MountDir: map[string]string{"/dev/vda1": esp}}
		err := Boot(context.Background(), log, cfg, d, d, d)
		if err == nil || d.Reboots != 1 || d.Execs != 0 || len(d.Loaded) != 0 {
			t.Fatalf("err %v reboots %d execs %d", err, d.Reboots, d.Execs)
		}
	})
	t.Run("load refused: falls back to reboot", func(t *testing.T) {
		d := &DryRun{MountDir: map[string]string{"/dev/vda2": boot}, LoadErr: errors.New("EPERM: lockdown")}
		err := Boot(context.Background(), log, cfg, d, d, d)
		if err == nil || !strings.Contains(err.Error(), "lockdown") || d.Reboots != 1 || d.Execs != 0 {
			t.Fatalf("err %v reboots %d", err, d.Reboots)
		}
	})
	t.Run("exec returns: falls back to reboot", func(t *testing.T) {
		d := &DryRun{MountDir: map[string]string{"/dev/vda2": boot}, ExecErr: errors.New("EINVAL")}
		if err := Boot(context.Background(), log, cfg, d, d, d); err == nil || d.Reboots != 1 || d.Execs != 1 {
			t.Fatalf("err %v reboots %d execs %d", err, d.Reboots, d.Execs)
		}
	})
	t.Run("unknown disk", func(t *testing.T) {
		d := &DryRun{}
		c := cfg
		c.Disk = "sdz"
		if err := Boot(context.Background(), log, c, d, d, d); err == nil || d.Reboots != 1 {
			t.Fatalf("err %v reboots %d", err, d.Reboots)
		}
	})
}

func TestPartitionsOrder(t *testing.T) {
	sys := sysfsWithPartitions(t, "nvme0n1", "nvme0n1p1", "nvme0n1p2", "nvme0n1p3")
	got, err := Partitions(sys, "nvme0n1")
	if err != nil || !reflect.DeepEqual(got, []string{"nvme0n1p1", "nvme0n1p2", "nvme0n1p3"}) {
		t.Fatalf("got %v %v", got, err)
	}
}

const syslinuxLab = `SERIAL 0 115200
DEFAULT bcd-os
PROMPT 0
TIMEOUT 0
LABEL bcd-os
  MENU LABEL bcd lab OS
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND console=ttyS0 bcd.role=os
`

// rereadMounter is a DryRun whose disk's partition table is re-read (or not) first.
type rereadMounter struct {
	*DryRun
	err     error
	rereads int
}

func (m *rereadMounter) RereadPartitions(context.Context, string) error {
	m.rereads++
	return m.err
}

// TestBootStalePartitions: when the kernel could not re-read the written disk's partition table,
// the partitions it lists are the old layout's (the previous OS's, at its offsets, beyond the
// new image perhaps): kexec must not boot what it finds there. The firmware reboot reads the
// table on the disk.
func TestBootStalePartitions(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	boot := partitionDir(t, map[string]string{
		"boot/grub/grub.cfg": grubDebian, "boot/vmlinuz-6.1.0-13-amd64": "OLDKERNEL", "boot/initrd.img-6.1.0-13-amd64": "OLDINITRD",
	})
	dev := t.TempDir()
	for _, n := range []string{"vda", "vda1", "vda2"} {
		if err := os.WriteFile(filepath.Join(dev, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name       string
		parts      []string
		rereadErr  error
		wantLoaded bool
		wantErr    string
	}{
		{name: "re-read", parts: []string{"vda1", "vda2"}, wantLoaded: true},
		{name: "re-read refused, partitions listed", parts: []string{"vda1", "vda2"}, rereadErr: errors.New("device or resource busy"),
			wantErr: "device or resource busy"},
		{name: "re-read refused, a filesystem on the whole disk", rereadErr: errors.New("invalid argument"), wantLoaded: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := &rereadMounter{DryRun: &DryRun{MountDir: map[string]string{
				filepath.Join(dev, "vda2"): boot, filepath.Join(dev, "vda"): boot,
			}}, err: tc.rereadErr}
			cfg := Config{Disk: "vda", SysRoot: sysfsWithPartitions(t, "vda", tc.parts...), DevRoot: dev, MountDir: t.TempDir(), TempDir: t.TempDir()}
			err := Boot(context.Background(), log, cfg, m, m.DryRun, m.DryRun)
			if m.rereads != 1 {
				t.Errorf("%d re-reads, want 1", m.rereads)
			}
			if loaded := len(m.Loaded) == 1 && m.Execs == 1; loaded != tc.wantLoaded {
				t.Fatalf("loaded %+v execs %d reboots %d err %v, want loaded %t", m.Loaded, m.Execs, m.Reboots, err, tc.wantLoaded)
			}
			if tc.wantLoaded {
				if err != nil || m.Reboots != 0 {
					t.Fatalf("err %v reboots %d", err, m.Reboots)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || m.Reboots != 1 {
				t.Fatalf("err %v reboots %d, want the fallback reboot and %q", err, m.Reboots, tc.wantErr)
			}
		})
	}
}
