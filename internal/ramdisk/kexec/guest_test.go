package kexec

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

func TestParseGuest(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Guest
		err  string
	}{
		{"", GuestNone, ""},
		{"none", GuestNone, ""},
		{"cloud-init", GuestCloudInit, ""},
		{"ignition", GuestIgnition, ""},
		{"cloudinit", "", `guest "cloudinit": accepted are none, cloud-init, ignition`},
		{"Ignition", "", `guest "Ignition": accepted are none, cloud-init, ignition`},
	} {
		got, err := ParseGuest(tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && err.Error() != tc.err {
			t.Errorf("ParseGuest(%q) = %q, %v; want %q, %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestGuestArgs(t *testing.T) {
	const site = "http://10.0.0.1:8080"
	for _, tc := range []struct {
		name  string
		guest Guest
		site  string
		want  []string
		err   string
	}{
		{"none", GuestNone, site, nil, ""},
		{"none needs no site", GuestNone, "", nil, ""},
		{"cloud-init", GuestCloudInit, site, []string{"ds=nocloud-net;s=http://10.0.0.1:8080/cloud-init/"}, ""},
		{"ignition", GuestIgnition, site, []string{"ignition.firstboot", "flatcar.first_boot=detected", "ignition.platform.id=metal", "ignition.config.url=http://10.0.0.1:8080/ignition.json"}, ""},
		{"unknown guest", "kickstart", site, nil, "accepted are none, cloud-init, ignition"},
		{"no site", GuestCloudInit, "", nil, "http or https"},
		{"site with a path", GuestCloudInit, site + "/x", nil, "no path"},
		{"site with a slash", GuestCloudInit, site + "/", nil, "no path"},
		{"site with a space", GuestIgnition, "http://a b", nil, "space"},
		{"site with a quote", GuestIgnition, `http://a"b`, nil, "quote"},
		{"site with user info", GuestIgnition, "http://u:p@a", nil, "user info"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := GuestArgs(tc.guest, tc.site)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestAppendArgs(t *testing.T) {
	ci := []string{"ds=nocloud-net;s=http://10.0.0.1/cloud-init/"}
	for _, tc := range []struct {
		name, cmdline string
		args          []string
		want          string
	}{
		{"nothing to add", "root=/dev/sda1 ro quiet", nil, "root=/dev/sda1 ro quiet"},
		{"appended", "root=/dev/sda1 ro", ci, "root=/dev/sda1 ro ds=nocloud-net;s=http://10.0.0.1/cloud-init/"},
		{"empty command line", "", ci, "ds=nocloud-net;s=http://10.0.0.1/cloud-init/"},
		{"an image's own ds replaced", "root=LABEL=root ds=ec2 console=ttyS0", ci, "root=LABEL=root console=ttyS0 ds=nocloud-net;s=http://10.0.0.1/cloud-init/"},
		{"already there: not twice", "ro ds=nocloud-net;s=http://10.0.0.1/cloud-init/ quiet", ci, "ro quiet ds=nocloud-net;s=http://10.0.0.1/cloud-init/"},
		{"same key twice in the image", "ignition.platform.id=qemu x ignition.platform.id=aws", []string{"ignition.platform.id=metal"}, "x ignition.platform.id=metal"},
		{"flag parameter not doubled", "ro ignition.firstboot", []string{"ignition.firstboot"}, "ro ignition.firstboot"},
		{"a key that is a prefix of another is kept", "ds.extra=1 ds=x", ci, "ds.extra=1 ds=nocloud-net;s=http://10.0.0.1/cloud-init/"},
		{"double quotes keep spaces", `root=/dev/sda1 acpi_osi="Windows 2015" quiet`, ci, `root=/dev/sda1 acpi_osi="Windows 2015" quiet ds=nocloud-net;s=http://10.0.0.1/cloud-init/`},
		{"quoted same key replaced", `"ds=a b" ro`, ci, "ro ds=nocloud-net;s=http://10.0.0.1/cloud-init/"},
		{"runs of spaces", "  root=/dev/sda1\t ro  ", ci, "root=/dev/sda1 ro ds=nocloud-net;s=http://10.0.0.1/cloud-init/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := AppendArgs(tc.cmdline, tc.args); got != tc.want {
				t.Fatalf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// Boot loads the target's command line with Config.Append added.
func TestBootAppendsGuestArgs(t *testing.T) {
	sys := sysfsWithPartitions(t, "vda", "vda1")
	boot := partitionDir(t, map[string]string{
		"boot/grub/grub.cfg": grubDebian, "boot/vmlinuz-6.1.0-13-amd64": "KERNEL", "boot/initrd.img-6.1.0-13-amd64": "INITRD",
	})
	args, err := GuestArgs(GuestCloudInit, "http://10.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Disk: "vda", SysRoot: sys, DevRoot: "/dev", MountDir: t.TempDir(), TempDir: t.TempDir(), Append: args}
	d := &DryRun{MountDir: map[string]string{"/dev/vda1": boot}}
	if err := Boot(context.Background(), slog.New(slog.DiscardHandler), cfg, d, d, d); err != nil {
		t.Fatal(err)
	}
	if len(d.Loaded) != 1 || d.Loaded[0].Cmdline != "root=UUID=1234 ro quiet ds=nocloud-net;s=http://10.0.0.1:8080/cloud-init/" {
		t.Fatalf("loaded %+v", d.Loaded)
	}
}
