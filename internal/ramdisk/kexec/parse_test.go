package kexec

import (
	"reflect"
	"strings"
	"testing"
)

const blsFedora = `# Fedora
title Fedora Linux (6.5.6-300.fc39.x86_64) 39
version 6.5.6-300.fc39.x86_64
linux /vmlinuz-6.5.6-300.fc39.x86_64
initrd /initramfs-6.5.6-300.fc39.x86_64.img
options root=UUID=1234 ro rhgb quiet
options console=ttyS0
grub_users $grub_users
`

func TestParseBLS(t *testing.T) {
	tests := []struct {
		name, id, text string
		want           Entry
		wantErr        bool
	}{
		{"fedora", "abc-6.5.6.conf", blsFedora, Entry{
			ID: "abc-6.5.6", Title: "Fedora Linux (6.5.6-300.fc39.x86_64) 39", Version: "6.5.6-300.fc39.x86_64",
			Kernel: "/vmlinuz-6.5.6-300.fc39.x86_64", Initrds: []string{"/initramfs-6.5.6-300.fc39.x86_64.img"},
			Cmdline: "root=UUID=1234 ro rhgb quiet console=ttyS0",
		}, false},
		{"two initrds, tabs", "x.conf", "linux\t/k\ninitrd /ucode.img\ninitrd\t/initrd.img\n", Entry{ID: "x", Kernel: "/k", Initrds: []string{"/ucode.img", "/initrd.img"}}, false},
		{"no linux", "x.conf", "title nothing\n", Entry{}, true},
		{"efi entry", "x.conf", "efi /EFI/tool.efi\nlinux /k\n", Entry{}, true},
		{"empty", "x.conf", "", Entry{}, true},
		{"keys only", "x.conf", "linux\n", Entry{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseBLS(tt.id, tt.text)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if !tt.wantErr && !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestSelectBLS(t *testing.T) {
	es := []Entry{
		{ID: "m-6.5.9", Version: "6.5.9", Kernel: "/a"},
		{ID: "m-6.5.10", Version: "6.5.10", Kernel: "/b"},
		{ID: "m-6.5.10-rescue", Version: "", Kernel: "/c"},
	}
	tests := []struct {
		conf, want string
	}{
		{"", "m-6.5.10"}, // 10 > 9 numerically
		{"default m-6.5.9.conf\n", "m-6.5.9"},
		{"timeout 3\ndefault *rescue*\n", "m-6.5.10-rescue"},
		{"default nomatch\n", "m-6.5.10"},
		{"default @saved\n", "m-6.5.10"},
	}
	for _, tt := range tests {
		got, err := SelectBLS(es, tt.conf)
		if err != nil || got.ID != tt.want {
			t.Errorf("loader.conf %q: got %q (%v), want %q", tt.conf, got.ID, err, tt.want)
		}
	}
	if _, err := SelectBLS(nil, ""); err == nil {
		t.Error("no entries: want error")
	}
}

func TestCompareVersions(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"6.5.10", "6.5.9", 1}, {"6.5.9", "6.5.10", -1}, {"1.0", "1.0", 0}, {"1.0", "1.0.1", -1},
		{"5.10.0-28-amd64", "5.10.0-9-amd64", 1}, {"a", "b", -1}, {"", "", 0}, {"1", "a", 1}, {"007", "7", 0},
	}
	for _, tt := range tests {
		if got := compareVersions(tt.a, tt.b); got != tt.want {
			t.Errorf("compare(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

const extlinuxConf = `# Generated
DEFAULT talos
TIMEOUT 30
PROMPT 0
MENU TITLE Boot

LABEL local
  LOCALBOOT 0

LABEL old
  MENU LABEL Old kernel
  KERNEL /boot/vmlinuz-old
  APPEND initrd=/boot/initrd-old root=/dev/sda2

label talos
  menu label Talos
  linux ../vmlinuz
  initrd ../ucode.img,../initramfs.xz
  append console=ttyS0 talos.platform=metal
  fdt /dtb
`

func TestParseExtlinux(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		def     string
		n       int
		wantErr bool
	}{
		{"default by label", extlinuxConf, "talos", 2, false},
		{"no default: first bootable", strings.Replace(extlinuxConf, "DEFAULT talos", "", 1), "old", 2, false},
		{"default unknown: first", strings.Replace(extlinuxConf, "DEFAULT talos", "DEFAULT nope", 1), "old", 2, false},
		{"ontimeout", "ONTIMEOUT b\nLABEL a\nKERNEL /a\nLABEL b\nKERNEL /b\n", "b", 2, false},
		{"no kernels", "DEFAULT x\nLABEL x\nLOCALBOOT 0\n", "", 0, true},
		{"empty", "", "", 0, true},
		{"kernel before any label ignored", "KERNEL /x\n", "", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			es, def, err := ParseExtlinux(tt.text)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v", err)
			}
			if tt.wantErr {
				return
			}
			if len(es) != tt.n || es[def].ID != tt.def {
				t.Fatalf("entries %+v default %d", es, def)
			}
		})
	}
	es, def, _ := ParseExtlinux(extlinuxConf)
	want := Entry{ID: "talos", Title: "Talos", Kernel: "../vmlinuz", Initrds: []string{"../ucode.img", "../initramfs.xz"}, Cmdline: "console=ttyS0 talos.platform=metal"}
	if !reflect.DeepEqual(es[def], want) {
		t.Errorf("talos = %+v\nwant %+v", es[def], want)
	}
	old := Entry{ID: "old", Title: "Old kernel", Kernel: "/boot/vmlinuz-old", Initrds: []string{"/boot/initrd-old"}, Cmdline: "root=/dev/sda2"}
	if !reflect.DeepEqual(es[0], old) {
		t.Errorf("old = %+v\nwant %+v", es[0], old)
	}
}

// A shortened grub.cfg as Debian's update-grub writes it.
const grubDebian = `
function load_video {
  if [ x$feature_all_video_module = xy ]; then
    insmod all_video
  fi
}
set default="0"
if [ x"${feature_menuentry_id}" = xy ]; then
  menuentry_id_option="--id"
fi
export menuentry_id_option
menuentry 'Debian GNU/Linux' --class debian --class gnu-linux --class os $menuentry_id_option 'gnulinux-simple-1234' {
	load_video
	insmod gzio
	if [ x$grub_platform = xxen ]; then insmod xzio; insmod lzopio; fi
	insmod part_gpt
	search --no-floppy --fs-uuid --set=root 1234
	echo	'Loading Linux 6.1.0-13-amd64 ...'
	linux	/boot/vmlinuz-6.1.0-13-amd64 root=UUID=1234 ro  quiet
	echo	'Loading initial ramdisk ...'
	initrd	/boot/initrd.img-6.1.0-13-amd64
}
submenu 'Advanced options for Debian GNU/Linux' $menuentry_id_option 'gnulinux-advanced-1234' {
	menuentry 'Debian GNU/Linux, with Linux 6.1.0-13-amd64' --class debian $menuentry_id_option 'gnulinux-6.1.0-13-amd64-advanced-1234' {
		linux	/boot/vmlinuz-6.1.0-13-amd64 root=UUID=1234 ro  quiet
		initrd	/boot/initrd.img-6.1.0-13-amd64
	}
	menuentry 'Debian GNU/Linux, with Linux 6.1.0-13-amd64 (recovery mode)' --class debian $menuentry_id_option 'gnulinux-6.1.0-13-amd64-recovery-1234' {
		linux	(hd0,gpt2)/boot/vmlinuz-6.1.0-13-amd64 root=UUID=1234 ro single
		initrd	($root)/boot/intel-ucode.img /boot/initrd.img-6.1.0-13-amd64
	}
}
menuentry 'UEFI Firmware Settings' $menuentry_id_option 'uefi-firmware' {
	fwsetup
}
`

func TestParseGrub(t *testing.T) {
	tests := []struct {
		name      string
		text      string
		saved     string
		wantTitle string
		wantErr   bool
	}{
		{"debian default 0", grubDebian, "", "Debian GNU/Linux", false},
		{"index into submenu", strings.Replace(grubDebian, `set default="0"`, `set default="1>1"`, 1), "", "Debian GNU/Linux, with Linux 6.1.0-13-amd64 (recovery mode)", false},
		{"submenu id > entry id", strings.Replace(grubDebian, `set default="0"`, `set default="gnulinux-advanced-1234>gnulinux-6.1.0-13-amd64-advanced-1234"`, 1), "", "Debian GNU/Linux, with Linux 6.1.0-13-amd64", false},
		{"bare id inside submenu", strings.Replace(grubDebian, `set default="0"`, `set default=gnulinux-6.1.0-13-amd64-recovery-1234`, 1), "", "Debian GNU/Linux, with Linux 6.1.0-13-amd64 (recovery mode)", false},
		{"saved", strings.Replace(grubDebian, `set default="0"`, `set default="${saved_entry}"`, 1), "1>0", "Debian GNU/Linux, with Linux 6.1.0-13-amd64", false},
		{"saved empty falls back to 0", strings.Replace(grubDebian, `set default="0"`, `set default=saved`, 1), "", "Debian GNU/Linux", false},
		{"submenu index alone: its first entry", strings.Replace(grubDebian, `set default="0"`, `set default=1`, 1), "", "Debian GNU/Linux, with Linux 6.1.0-13-amd64", false},
		{"default without linux", strings.Replace(grubDebian, `set default="0"`, `set default=2`, 1), "", "", true},
		{"out of range", strings.Replace(grubDebian, `set default="0"`, `set default=9`, 1), "", "", true},
		{"unknown title", strings.Replace(grubDebian, `set default="0"`, `set default="Windows"`, 1), "", "", true},
		{"unbalanced close", "}\n", "", "", true},
		{"unclosed", "menuentry 'x' {\nlinux /k\n", "", "", true},
		{"unterminated quote", "menuentry 'x {\n", "", "", true},
		{"no entries", "set timeout=5\n", "", "", true},
		{"nested menuentry", "menuentry a {\nmenuentry b {\n}\n}\n", "", "", true},
		{"linux without path", "menuentry a {\nlinux\n}\n", "", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, e, err := ParseGrub(tt.text, tt.saved)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v (entry %+v)", err, e)
			}
			if !tt.wantErr && e.Title != tt.wantTitle {
				t.Errorf("default %q, want %q", e.Title, tt.wantTitle)
			}
		})
	}
	all, e, err := ParseGrub(grubDebian, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 {
		t.Errorf("%d entries, want 4", len(all))
	}
	want := Entry{ID: "gnulinux-simple-1234", Title: "Debian GNU/Linux", Kernel: "/boot/vmlinuz-6.1.0-13-amd64",
		Initrds: []string{"/boot/initrd.img-6.1.0-13-amd64"}, Cmdline: "root=UUID=1234 ro quiet"}
	if !reflect.DeepEqual(e, want) {
		t.Errorf("got %+v\nwant %+v", e, want)
	}
	if r := all[2]; r.Kernel != "/boot/vmlinuz-6.1.0-13-amd64" || !reflect.DeepEqual(r.Initrds, []string{"/boot/intel-ucode.img", "/boot/initrd.img-6.1.0-13-amd64"}) {
		t.Errorf("device prefixes not stripped: %+v", r)
	}
}

func TestShellWords(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{`a b  c`, []string{"a", "b", "c"}},
		{`menuentry 'Debian, with Linux' --class x {`, []string{"menuentry", "Debian, with Linux", "--class", "x", "{"}},
		{`echo "a \"q\" b" # comment`, []string{"echo", `a "q" b`}},
		{`a\ b`, []string{"a b"}},
		{`x''`, []string{"x"}},
		{`''`, []string{""}},
		{``, nil},
	}
	for _, tt := range tests {
		got, err := shellWords(tt.in)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("shellWords(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func FuzzParseBLS(f *testing.F) {
	f.Add(blsFedora)
	f.Add("linux /k\ninitrd /i\noptions a=b\n")
	f.Add("efi /x\n")
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseBLS("f.conf", s)
		if err == nil && e.Kernel == "" {
			t.Fatal("entry without kernel accepted")
		}
	})
}

func FuzzParseExtlinux(f *testing.F) {
	f.Add(extlinuxConf)
	f.Add("LABEL a\nKERNEL /a\nAPPEND initrd=/i,/j x\n")
	f.Fuzz(func(t *testing.T, s string) {
		es, def, err := ParseExtlinux(s)
		if err != nil {
			return
		}
		if def < 0 || def >= len(es) || es[def].Kernel == "" {
			t.Fatalf("bad default %d of %d", def, len(es))
		}
	})
}

func FuzzParseGrub(f *testing.F) {
	f.Add(grubDebian, "")
	f.Add("set default=1>0\nsubmenu s {\nmenuentry e {\nlinux /k a\n}\n}\n", "")
	f.Add("menuentry 'a' {\nlinux (hd0)/k\ninitrd /i\n}\n", "0")
	f.Fuzz(func(t *testing.T, s, saved string) {
		_, e, err := ParseGrub(s, saved)
		if err == nil && e.Kernel == "" {
			t.Fatal("default without kernel accepted")
		}
	})
}
