package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"bcd/internal/ramdisk/inventory"
	"bcd/internal/ramdisk/kexec"
)

// boot.kexec's guest arguments reach the loaded command line; bad ones fail the command before
// anything is loaded or rebooted, saying what is accepted.
func TestKexecGuestArgs(t *testing.T) {
	for _, tc := range []struct {
		name, args, site, cmdline, err string // site: the ramdisk command line's bcd_site
	}{
		{"no guest", `{}`, "", "root=LABEL=root ro", ""},
		{"none", `{"guest":"none"}`, "http://10.0.0.2:8080", "root=LABEL=root ro", ""},
		{"cloud-init", `{"guest":"cloud-init","guestSite":"http://10.0.0.1:8080"}`, "", "root=LABEL=root ro ds=nocloud-net;s=http://10.0.0.1:8080/cloud-init/", ""},
		{"ignition", `{"guest":"ignition","guestSite":"http://10.0.0.1:8080"}`, "",
			"root=LABEL=root ro ignition.firstboot flatcar.first_boot=detected ignition.platform.id=metal ignition.config.url=http://10.0.0.1:8080/ignition.json", ""},
		{"unknown guest", `{"guest":"kickstart"}`, "", "", `guest "kickstart": accepted are none, cloud-init, ignition`},
		{"no site", `{"guest":"ignition"}`, "", "", "needs the site's boot HTTP URL (http://host:port): the command has no guestSite and the ramdisk's command line no bcd_site"},
		{"site with a path", `{"guest":"cloud-init","guestSite":"http://10.0.0.1:8080/x"}`, "", "", "from the command's guestSite: the site URL must be scheme://host[:port] with no path"},
		// The site agent's URL from the ramdisk's command line, unless the command names one.
		{"cloud-init, site from the command line", `{"guest":"cloud-init"}`, "http://10.0.0.2:8080", "root=LABEL=root ro ds=nocloud-net;s=http://10.0.0.2:8080/cloud-init/", ""},
		{"ignition, site from the command line", `{"guest":"ignition"}`, "http://10.0.0.2:8080",
			"root=LABEL=root ro ignition.firstboot flatcar.first_boot=detected ignition.platform.id=metal ignition.config.url=http://10.0.0.2:8080/ignition.json", ""},
		{"guestSite wins", `{"guest":"cloud-init","guestSite":"http://10.0.0.1:8080"}`, "http://10.0.0.2:8080", "root=LABEL=root ro ds=nocloud-net;s=http://10.0.0.1:8080/cloud-init/", ""},
		{"command line site with a path", `{"guest":"cloud-init"}`, "http://10.0.0.2:8080/boot", "", "from the ramdisk command line's bcd_site: the site URL must be scheme://host[:port] with no path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dev := filepath.Join(root, "dev")
			for _, d := range []string{dev, filepath.Join(root, "sys/class/block/vda/vda1"), filepath.Join(root, "esp/loader/entries"), filepath.Join(root, "mnt")} {
				if err := os.MkdirAll(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			for p, c := range map[string]string{
				"sys/class/block/vda/vda1/partition": "1\n",
				"esp/loader/entries/os.conf":         "title OS\nlinux /vmlinuz\noptions root=LABEL=root ro\n",
				"esp/vmlinuz":                        "KERNEL",
			} {
				if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			dry := &kexec.DryRun{MountDir: map[string]string{filepath.Join(dev, "vda1"): filepath.Join(root, "esp")}}
			d := testDeps(t, inventory.Inventory{Disks: []inventory.Disk{{Name: "vda", Path: filepath.Join(dev, "vda"), SizeBytes: 8 << 30}}})
			d.KexecConfig = kexec.Config{SysRoot: filepath.Join(root, "sys"), DevRoot: dev, MountDir: filepath.Join(root, "mnt")}
			d.Mounter, d.Kexec, d.Rebooter = dry, dry, dry
			cmds := NewCommands(d)
			cmds.SetSite(tc.site)
			_, err, _ := run(t, cmds, KindKexec, tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || len(dry.Loaded) != 0 || dry.Reboots != 0 {
					t.Fatalf("err %v (want %q), loaded %d, reboots %d", err, tc.err, len(dry.Loaded), dry.Reboots)
				}
				return
			}
			if err != nil || len(dry.Loaded) != 1 || dry.Loaded[0].Cmdline != tc.cmdline {
				t.Fatalf("err %v, loaded %+v, want command line %q", err, dry.Loaded, tc.cmdline)
			}
		})
	}
}
