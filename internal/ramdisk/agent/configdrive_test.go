package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"bcd/internal/netboot"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/workflow"
)

// configDriveDisk is an 8 GiB sparse disk holding an MBR with one 16 MiB partition at 1 MiB,
// as an image deploy.image wrote would.
func configDriveDisk(t *testing.T) (inventory.Disk, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "vda")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mbr := make([]byte, 512)
	e := mbr[446:]
	e[0], e[4] = 0x80, 0x83
	binary.LittleEndian.PutUint32(e[8:], 2048)
	binary.LittleEndian.PutUint32(e[12:], 32768)
	mbr[510], mbr[511] = 0x55, 0xaa
	if _, err := f.WriteAt(mbr, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(8 << 30); err != nil {
		t.Fatal(err)
	}
	return inventory.Disk{Name: "vda", Path: path, SizeBytes: 8 << 30, LogicalBlockSize: 512}, mbr
}

// configDriveCommands are the ramdisk's commands with disk its only disk, opened read-write.
func configDriveCommands(t *testing.T, disk inventory.Disk) *Commands {
	t.Helper()
	d := testDeps(t, inventory.Inventory{Disks: []inventory.Disk{disk}})
	d.OpenDisk = func(_ context.Context, path string) (DiskDevice, error) { return os.OpenFile(path, os.O_RDWR, 0) }
	return NewCommands(d)
}

// readSector reads the 512 bytes at byte off of the file at path.
func readSector(t *testing.T, path string, off int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 512)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// guestSite serves NoCloud documents as a site agent does to the node's address; a nil map
// answers 404 (no instance prepared).
func guestSite(t *testing.T, docs map[string]string, status int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name, ok := strings.CutPrefix(r.URL.Path, netboot.CloudInitPath)
		if status != 0 {
			w.WriteHeader(status)
			return
		}
		if d, found := docs[name]; ok && found {
			w.Write([]byte(d))
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// deploy.configDrive reads the node's documents from the site, refuses another node's or
// another deploy's (leaving the disk as it was), writes them to a config drive on the disk, and
// rewrites the same drive when retried. With format openstack it writes the same documents in
// OpenStack's layout: a FAT labelled config-2 (lower case) holding openstack/latest/
// meta_data.json naming the node as the instance (uuid), user_data as the deploy gave it, and
// vendor_data.json carrying bcd's vendor-data under "cloud-init".
func TestConfigDrive(t *testing.T) {
	const node = "0193a1b2-node"
	userData := "#cloud-config\nhostname: n0\n"
	sum := sha256.Sum256([]byte(userData))
	userSum := hex.EncodeToString(sum[:])
	vendor, err := netboot.VendorData("http://10.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	good := map[string]string{"meta-data": netboot.MetaData(node), "user-data": userData, "vendor-data": vendor}
	with := func(name, v string) map[string]string {
		m := map[string]string{}
		for k, d := range good {
			m[k] = d
		}
		m[name] = v
		return m
	}
	args := func(site, sha string) string {
		b, _ := json.Marshal(map[string]string{"nodeId": node, "userDataSha256": sha, "guestSite": site})
		return string(b)
	}
	inFormat := func(format string) func(site string) string {
		return func(site string) string {
			b, _ := json.Marshal(map[string]string{"nodeId": node, "userDataSha256": userSum, "guestSite": site, "format": format})
			return string(b)
		}
	}
	meta, _ := json.Marshal(map[string]string{"uuid": node})
	vendorJSON, _ := json.Marshal(map[string]string{"cloud-init": vendor})
	openStack := map[string]string{"openstack/latest/meta_data.json": string(meta), "openstack/latest/user_data": userData,
		"openstack/latest/vendor_data.json": string(vendorJSON)}
	for _, tc := range []struct {
		name   string
		docs   map[string]string
		status int
		args   func(site string) string
		err    string
		files  map[string]string // on the drive (nil: docs, in NoCloud's layout)
	}{
		{"the deploy's user-data", good, 0, func(s string) string { return args(s, userSum) }, "", nil},
		{"no user-data: bcd's empty cloud-config", with("user-data", netboot.UserData), 0, func(s string) string { return args(s, "") }, "", nil},
		{"another node's meta-data", with("meta-data", netboot.MetaData("other")), 0, func(s string) string { return args(s, userSum) }, "the site's meta-data is not node " + node + "'s", nil},
		{"another deploy's user-data", with("user-data", "#cloud-config\n{}\n# older\n"), 0, func(s string) string { return args(s, userSum) }, "not the deploy's " + userSum, nil},
		{"user-data where the deploy gave none", good, 0, func(s string) string { return args(s, "") }, "where the deploy gave none", nil},
		{"no instance prepared", nil, 0, func(s string) string { return args(s, userSum) }, "boot.prepareInstance has not run", nil},
		{"user-data not yet on the site", good, http.StatusServiceUnavailable, func(s string) string { return args(s, userSum) }, "does not hold the deploy's user-data yet", nil},
		{"no nodeId", good, 0, func(s string) string { return `{"guestSite":"` + s + `"}` }, "names no nodeId", nil},
		{"no site", good, 0, func(string) string { return `{"nodeId":"` + node + `"}` }, "needs the site's boot HTTP URL", nil},
		{"a site with a path", good, 0, func(s string) string { return args(s+"/x", userSum) }, "must be scheme://host[:port] with no path", nil},
		{"NoCloud's layout named", good, 0, inFormat("nocloud"), "", nil},
		{"OpenStack's layout", good, 0, inFormat("openstack"), "", openStack},
		{"OpenStack's layout, another node's meta-data", with("meta-data", netboot.MetaData("other")), 0, inFormat("openstack"), "the site's meta-data is not node " + node + "'s", nil},
		{"a layout it does not know", good, 0, inFormat("iso9660"), `format "iso9660": nocloud or openstack is accepted`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			disk, mbr := configDriveDisk(t)
			cmds := configDriveCommands(t, disk)
			site := guestSite(t, tc.docs, tc.status)
			res, err, _ := run(t, cmds, KindConfigDrive, tc.args(site))
			head := readSector(t, disk.Path, 0)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				if strings.Contains(err.Error(), "hostname: n0") {
					t.Fatalf("the error quotes the user-data: %v", err)
				}
				if !bytes.Equal(head, mbr) {
					t.Fatal("a refused config drive changed the partition table")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got ConfigDriveResult
			if err := json.Unmarshal(res, &got); err != nil {
				t.Fatal(err)
			}
			if got.Device != disk.Path || got.Table != "mbr" || got.Partition != 2 || got.Reused || got.Start < 17<<20 {
				t.Fatalf("result %s", res)
			}
			files, label := tc.docs, "CIDATA"
			if tc.files != nil {
				files, label = tc.files, "config-2"
			}
			if len(got.Files) != len(files) || got.Label != label {
				t.Fatalf("result %s: want label %s and files %v", res, label, slices.Sorted(maps.Keys(files)))
			}
			for name, data := range files {
				s := sha256.Sum256([]byte(data))
				if got.Files[name] != hex.EncodeToString(s[:]) {
					t.Errorf("%s: sha256 %s in the result, want that of %q", name, got.Files[name], data)
				}
			}
			// The FAT's boot sector carries the label as written (config-2 in lower case).
			if l := string(readSector(t, disk.Path, got.Start)[43:54]); l != fmt.Sprintf("%-11s", label) {
				t.Fatalf("boot sector label %q, want %q", l, label)
			}
			if bytes.Equal(head, mbr) || !bytes.Equal(head[446:462], mbr[446:462]) {
				t.Fatal("the partition table has no new entry, or the image's own changed")
			}
			// A retry (a lost command run again) rewrites the same partition.
			res, err, _ = run(t, cmds, KindConfigDrive, tc.args(site))
			var again ConfigDriveResult
			if err != nil || json.Unmarshal(res, &again) != nil || !again.Reused || again.Partition != got.Partition || again.Start != got.Start {
				t.Fatalf("retry: %s %v", res, err)
			}
		})
	}
}

// The formats a profile's deploy.configDrive may name are those the ramdisk writes: each of
// them resolves, and any other is refused when the profile is stored.
func TestConfigDriveFormatsMatchTheWorkflow(t *testing.T) {
	profile := func(format string) workflow.Profile {
		return workflow.Profile{Name: "cloud", Steps: []workflow.Step{
			{Use: "metal.ensureRamdisk"}, {Use: "deploy.image", Args: map[string]string{"image": "$image"}}, {Use: "boot.prepareInstance"},
			{Use: "deploy.configDrive", Args: map[string]string{"format": format}}, {Use: "boot.kexec"},
		}, Cleanup: []workflow.Step{{Use: "boot.cleanUp"}}}
	}
	for _, tc := range []struct {
		format string
		ok     bool
	}{{FormatNoCloud, true}, {FormatOpenStack, true}, {"iso9660", false}, {"OpenStack", false}} {
		_, err := workflow.Resolve(profile(tc.format), map[string]string{"image": "img"})
		if (err == nil) != tc.ok {
			t.Errorf("format %q: the workflow says %v, want accepted %v", tc.format, err, tc.ok)
		}
	}
}
