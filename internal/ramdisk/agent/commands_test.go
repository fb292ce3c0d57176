package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/engine"
	"bcd/internal/ramdisk/diag"
	"bcd/internal/ramdisk/inventory"
	"bcd/internal/ramdisk/kexec"
	"bcd/internal/ramdisk/wipe"
)

const mib = 1 << 20

// fileDisk makes a file standing in for a disk, full of non-zero bytes.
func fileDisk(t *testing.T, name string, size int) inventory.Disk {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, bytes.Repeat([]byte{0xA5}, size), 0o600); err != nil {
		t.Fatal(err)
	}
	return inventory.Disk{Name: name, Path: p, Serial: "S-" + name, SizeBytes: uint64(size)}
}

// dropDev acknowledges writes and keeps nothing: its read-back finds the old data.
type dropDev struct{ size int64 }

func (d dropDev) ReadAt(p []byte, _ int64) (int, error) {
	for i := range p {
		p[i] = 0x5A
	}
	return len(p), nil
}
func (d dropDev) WriteAt(p []byte, _ int64) (int, error) { return len(p), nil }
func (d dropDev) Size() int64                            { return d.size }
func (d dropDev) Close() error                           { return nil }

// openers routes paths to fake devices, everything else to files.
type openers struct {
	drop map[string]bool
	fail map[string]bool
}

func (o openers) Open(ctx context.Context, path string) (wipe.OpenedDevice, error) {
	switch {
	case o.fail[path]:
		return nil, errors.New("device busy")
	case o.drop[path]:
		return dropDev{size: 4 * mib}, nil
	}
	return wipe.LinuxOpener{Options: wipe.OpenOptions{NoDirect: true}}.Open(ctx, path)
}

func testDeps(t *testing.T, inv inventory.Inventory) Deps {
	return Deps{
		Log:         slog.New(slog.DiscardHandler),
		Inventory:   func(context.Context) (inventory.Inventory, error) { return inv, nil },
		Wipe:        openers{},
		WipeRequest: wipe.Request{Samples: 4, SampleBytes: 4096, Seed: 7},
	}
}

type progressLog struct {
	mu sync.Mutex
	ps []agentlink.Progress
}

func (p *progressLog) report(pr agentlink.Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ps = append(p.ps, pr)
}

func (p *progressLog) n() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ps)
}

func run(t *testing.T, c *Commands, kind, args string) ([]byte, error, *progressLog) {
	t.Helper()
	p := &progressLog{}
	res, err := c.Run(t.Context(), agentlink.Command{ID: "c1", Kind: kind, Args: []byte(args)}, p.report)
	return res, err, p
}

func TestUnknownKind(t *testing.T) {
	c := NewCommands(testDeps(t, inventory.Inventory{}))
	_, err, _ := run(t, c, "bmc.power", `{}`)
	want := `unknown command kind "bmc.power": this ramdisk runs bmc.provisionInband, boot.kexec, deploy.configDrive, deploy.image, diag.dcgm, disk.wipe, inventory.refresh, ramdisk.powerOff`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v", err)
	}
}

func TestInventoryRefresh(t *testing.T) {
	inv := inventory.Inventory{
		DMI:   inventory.DMI{ProductUUID: "4c4c4544-0042", ProductSerial: "SN1"},
		NICs:  []inventory.NIC{{Name: "eno1", MAC: "52:54:00:AA:BB:01"}, {Name: "eno2", MAC: "52:54:00:aa:bb:02"}, {Name: "ib0"}},
		Disks: []inventory.Disk{{Name: "nvme0n1", SizeBytes: 1 << 40}},
	}
	res, err, _ := run(t, NewCommands(testDeps(t, inv)), KindInventory, "")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		SystemUUID string           `json:"systemUuid"`
		MACs       []string         `json:"macs"`
		DMI        inventory.DMI    `json:"dmi"`
		Disks      []inventory.Disk `json:"disks"`
		NICs       []inventory.NIC  `json:"nics"`
	}
	if err := json.Unmarshal(res, &got); err != nil {
		t.Fatal(err)
	}
	if got.SystemUUID != "4c4c4544-0042" || strings.Join(got.MACs, ",") != "52:54:00:aa:bb:01,52:54:00:aa:bb:02" ||
		got.DMI.ProductSerial != "SN1" || len(got.Disks) != 1 || len(got.NICs) != 3 {
		t.Fatalf("result %s", res)
	}
}

type wipeDisk struct {
	Device       string `json:"device"`
	Name         string `json:"name"`
	Method       string `json:"method"`
	Verified     bool   `json:"verified"`
	Serial       string `json:"serial"`
	Error        string `json:"error"`
	Flushed      bool   `json:"flushed"`
	Verification struct {
		AllZero bool `json:"allZero"`
	} `json:"verification"`
}

func TestDiskWipe(t *testing.T) {
	tests := []struct {
		name         string
		args         string
		drop, fail   []int // indexes of the disks wiped: sda, nvme0n1, and the removable sdb
		noDisks      bool
		undriven     bool // a SAS HBA without a driver
		wantErr      string
		wantVerified []bool // per wiped disk; nil: no result
	}{
		{name: "quick", args: `{"mode":"quick"}`, wantVerified: []bool{true, true, true}},
		{name: "full", args: `{"mode":"full"}`, wantVerified: []bool{true, true, true}},
		{name: "secure falls back to zeros on a file", args: `{"mode":"secure"}`, wantVerified: []bool{true, true, true}},
		{name: "writes dropped", args: `{"mode":"quick"}`, drop: []int{1}, wantErr: "verification failed", wantVerified: []bool{true, false, true}},
		{name: "disk busy", args: `{"mode":"full"}`, fail: []int{0}, wantErr: "device busy", wantVerified: []bool{false, true, true}},
		{name: "removable disk busy", args: `{"mode":"quick"}`, fail: []int{2}, wantErr: "device busy", wantVerified: []bool{true, true, false}},
		{name: "bad mode", args: `{"mode":"gentle"}`, wantErr: "wipe mode"},
		{name: "no mode", args: `{}`, wantErr: "wipe mode"},
		{name: "not JSON", args: `{"mode":`, wantErr: "reading the arguments"},
		{name: "only read-only media", args: `{"mode":"quick"}`, noDisks: true, wantErr: "no writable disk"},
		{name: "storage controller without a driver", args: `{"mode":"full"}`, undriven: true,
			wantErr: "SAS controller 0000:5e:00.0 (PCI 1000:0097, class 010700) has no driver bound: the disks behind it cannot be seen, so they cannot be wiped by this ramdisk"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			usb := fileDisk(t, "sdb", 2*mib)
			usb.Removable = true
			disks := []inventory.Disk{fileDisk(t, "sda", 4*mib), fileDisk(t, "nvme0n1", 3*mib), usb}
			// Virtual media with an ISO in it: removable, read-only, left alone and named.
			media := inventory.Disk{Name: "sdc", Path: filepath.Join(t.TempDir(), "absent"), Removable: true, ReadOnly: true, SizeBytes: 600 << 20}
			inv := inventory.Inventory{
				Disks:   append(append([]inventory.Disk{}, disks...), media),
				Skipped: []inventory.Skipped{{Kind: "disk", Name: "sr0", Reason: "optical drive"}, {Kind: "nic", Name: "lo", Reason: "loopback"}},
				PCI: []inventory.PCIDevice{
					{Address: "0000:00:1f.2", Vendor: "8086", Device: "2922", Class: "010601", Driver: "ahci"},
					{Address: "0000:00:14.0", Vendor: "8086", Device: "a36d", Class: "0c0330", Driver: ""}, // not storage
				},
			}
			if tc.noDisks {
				inv.Disks = []inventory.Disk{media}
			}
			if tc.undriven {
				inv.PCI = append(inv.PCI, inventory.PCIDevice{Address: "0000:5e:00.0", Vendor: "1000", Device: "0097", Class: "010700"})
			}
			d := testDeps(t, inv)
			o := openers{drop: map[string]bool{}, fail: map[string]bool{}}
			for _, i := range tc.drop {
				o.drop[disks[i].Path] = true
			}
			for _, i := range tc.fail {
				o.fail[disks[i].Path] = true
			}
			d.Wipe = o
			res, err, prog := run(t, NewCommands(d), KindWipe, tc.args)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if tc.wantVerified == nil {
				if res != nil {
					t.Fatalf("result without a wipe: %s", res)
				}
				for _, dk := range disks {
					if b, _ := os.ReadFile(dk.Path); bytes.Count(b, []byte{0}) != 0 {
						t.Errorf("%s written to by a refused wipe", dk.Name)
					}
				}
				return
			}
			var got struct {
				Mode    string        `json:"mode"`
				Disks   []wipeDisk    `json:"disks"`
				Skipped []SkippedDisk `json:"skipped"`
			}
			if err := json.Unmarshal(res, &got); err != nil {
				t.Fatalf("%v: %s", err, res)
			}
			if len(got.Disks) != len(tc.wantVerified) {
				t.Fatalf("%d disks in the result, want %d (removable writable disks are wiped): %s", len(got.Disks), len(tc.wantVerified), res)
			}
			wantSkipped := []SkippedDisk{
				{Name: "sdc", Reason: "read-only removable device (CD-ROM, virtual media or write-protected card): it cannot be written"},
				{Name: "sr0", Reason: "not a disk the wipe writes (inventory: optical drive)"},
			}
			if !reflect.DeepEqual(got.Skipped, wantSkipped) {
				t.Errorf("skipped = %+v, want %+v", got.Skipped, wantSkipped)
			}
			for i, gd := range got.Disks {
				if gd.Device != disks[i].Path || gd.Name != disks[i].Name || gd.Serial != disks[i].Serial {
					t.Errorf("disk %d: %+v", i, gd)
				}
				if gd.Verified != tc.wantVerified[i] || gd.Verified != gd.Verification.AllZero {
					t.Errorf("disk %d verified=%t allZero=%t, want %t (%s)", i, gd.Verified, gd.Verification.AllZero, tc.wantVerified[i], gd.Error)
				}
				if gd.Verified && (gd.Method == "" || !gd.Flushed) {
					t.Errorf("disk %d: method %q flushed %t", i, gd.Method, gd.Flushed)
				}
				if gd.Verified && tc.args == `{"mode":"full"}` {
					b, err := os.ReadFile(disks[i].Path)
					if err != nil {
						t.Fatal(err)
					}
					if bytes.Count(b, []byte{0}) != len(b) {
						t.Errorf("disk %d: the full wipe left data", i)
					}
				}
			}
			if err == nil && prog.n() == 0 {
				t.Error("no progress reported")
			}
			// The control plane's reading of the result: releasing completes only when every
			// wiped disk read back; the skipped list is extra and must not get in its way.
			var cp engine.WipeResult
			if err := json.Unmarshal(res, &cp); err != nil {
				t.Fatalf("the control plane cannot read the result: %v", err)
			}
			allVerified := len(cp.Disks) == len(disks)
			for i, d := range cp.Disks {
				allVerified = allVerified && d.Verified && d.Device == disks[i].Path
			}
			if allVerified != (err == nil) {
				t.Errorf("control plane sees every disk verified = %t, the wipe's error = %v", allVerified, err)
			}
		})
	}
}

// fileTarget is a file standing in for the image's disk.
type fileTarget struct {
	*os.File
	size int64
}

func (f fileTarget) Size() int64 { return f.size }

func TestDeployThenKexec(t *testing.T) {
	img := bytes.Repeat([]byte("bcd-image-"), 300_000) // 3 MB, raw
	sum := sha256.Sum256(img)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/os.raw" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(img)
	}))
	t.Cleanup(srv.Close)

	root := t.TempDir()
	dev := filepath.Join(root, "dev")
	for _, d := range []string{dev, filepath.Join(root, "sys/class/block/nvme0n1/nvme0n1p1"), filepath.Join(root, "esp/loader/entries"), filepath.Join(root, "mnt")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"sys/class/block/nvme0n1/nvme0n1p1/partition": "1\n",
		"esp/loader/entries/os.conf":                  "title OS\nlinux /vmlinuz\ninitrd /initrd\noptions root=LABEL=root ro\n",
		"esp/vmlinuz":                                 "KERNEL",
		"esp/initrd":                                  "INITRD",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	disks := []inventory.Disk{
		{Name: "sda", Path: filepath.Join(dev, "sda"), Serial: "BIG", SizeBytes: 1 << 40, Rotational: true},
		{Name: "nvme0n1", Path: filepath.Join(dev, "nvme0n1"), Serial: "ROOT", SizeBytes: 64 << 30},
	}
	dry := &kexec.DryRun{MountDir: map[string]string{filepath.Join(dev, "nvme0n1p1"): filepath.Join(root, "esp")}}
	d := testDeps(t, inventory.Inventory{Disks: disks})
	var opened []string
	d.OpenTarget = func(_ context.Context, path string) (ImageTarget, error) {
		opened = append(opened, path)
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		return fileTarget{f, 8 * mib}, err
	}
	d.KexecConfig = kexec.Config{SysRoot: filepath.Join(root, "sys"), DevRoot: dev, MountDir: filepath.Join(root, "mnt"), TempDir: t.TempDir()}
	d.Mounter, d.Kexec, d.Rebooter = dry, dry, dry
	c := NewCommands(d)

	refusals := []struct{ args, want string }{
		{`{"image":"ubuntu-24.04"}`, `image "ubuntu-24.04": the command carries no url`},
		{`{"image":"ubuntu-24.04","url":"` + srv.URL + `/os.raw"}`, "no sha256 or sha512"},
		{`{"image":"x","url":"` + srv.URL + `/os.raw","sha256":"` + strings.Repeat("0", 64) + `"}`, "digest mismatch"},
		{`{"image":"x","url":"` + srv.URL + `/os.raw","sha256":"` + hex.EncodeToString(sum[:]) + `","rootDeviceHints":{"serial":"NOPE"}}`, "no writable disk matches"},
	}
	for _, r := range refusals {
		if _, err, _ := run(t, c, KindDeploy, r.args); err == nil || !strings.Contains(err.Error(), r.want) {
			t.Errorf("%s: err = %v, want %q", r.args, err, r.want)
		}
	}
	if len(opened) != 1 {
		t.Fatalf("disks opened by refused deploys: %v (only the digest mismatch gets that far)", opened)
	}

	args := `{"image":"ubuntu-24.04","url":"` + srv.URL + `/os.raw","format":"raw","compression":"none","sha256":"` +
		hex.EncodeToString(sum[:]) + `","size":"3000000","rootDeviceHints":{"serial":"ROOT"},"added":"ignored"}`
	res, err, prog := run(t, c, KindDeploy, args)
	if err != nil {
		t.Fatal(err)
	}
	var got DeployResult
	if err := json.Unmarshal(res, &got); err != nil {
		t.Fatal(err)
	}
	if got.Device != disks[1].Path || got.Bytes != int64(len(img)) || got.SHA256 != hex.EncodeToString(sum[:]) || got.Image != "ubuntu-24.04" {
		t.Fatalf("result %s", res)
	}
	if written, _ := os.ReadFile(disks[1].Path); !bytes.Equal(written[:len(img)], img) {
		t.Fatal("the disk does not hold the image")
	}
	if prog.n() == 0 {
		t.Error("no progress reported")
	}

	if _, err, _ := run(t, c, KindKexec, ""); err != nil {
		t.Fatal(err)
	}
	if len(dry.Loaded) != 1 || string(dry.Loaded[0].Kernel) != "KERNEL" || string(dry.Loaded[0].Initrd) != "INITRD" ||
		dry.Loaded[0].Cmdline != "root=LABEL=root ro" || dry.Execs != 1 || dry.Reboots != 0 {
		t.Fatalf("kexec %+v", dry)
	}
}

func TestKexecFallsBackToReboot(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "sys/class/block/vda"), 0o700); err != nil {
		t.Fatal(err)
	}
	dry := &kexec.DryRun{}
	d := testDeps(t, inventory.Inventory{Disks: []inventory.Disk{{Name: "vda", Path: "/dev/vda", SizeBytes: 8 << 30}}})
	d.KexecConfig = kexec.Config{SysRoot: filepath.Join(root, "sys"), DevRoot: filepath.Join(root, "dev"), MountDir: filepath.Join(root, "mnt")}
	d.Mounter, d.Kexec, d.Rebooter = dry, dry, dry
	_, err, _ := run(t, NewCommands(d), KindKexec, `{}`)
	if err == nil || !strings.Contains(err.Error(), "booting /dev/vda") || dry.Reboots != 1 {
		t.Fatalf("err = %v, reboots %d", err, dry.Reboots)
	}
}

type fakeDCGM struct {
	out  []byte
	code int
	err  error
	args []string
}

func (f *fakeDCGM) Run(_ context.Context, name string, args ...string) ([]byte, int, error) {
	f.args = append([]string{name}, args...)
	return f.out, f.code, f.err
}

func TestDiagDCGM(t *testing.T) {
	pass, err := os.ReadFile("../diag/testdata/dcgm3-level1-pass.json")
	if err != nil {
		t.Fatal(err)
	}
	gpu := []inventory.PCIDevice{{Address: "0000:af:00.0", Vendor: "10de", Class: "030200", GPU: true, NVIDIA: true}}
	tests := []struct {
		name        string
		pci         []inventory.PCIDevice
		args        string
		runner      *fakeDCGM
		wantResult  string
		wantErr     string
		wantCommand string
	}{
		{name: "no GPU", args: `{"level":"2"}`, runner: &fakeDCGM{}, wantResult: "not applicable"},
		{name: "pass", pci: gpu, args: `{"level":1}`, runner: &fakeDCGM{out: pass}, wantResult: "pass", wantCommand: "dcgmi diag -r 1 -j"},
		{name: "no dcgmi", pci: gpu, args: `{"level":"2"}`, runner: &fakeDCGM{err: errors.New("executable file not found")}, wantResult: "fail", wantErr: "executable file not found", wantCommand: "dcgmi diag -r 2 -j"},
		{name: "bad level", pci: gpu, args: `{"level":"high"}`, runner: &fakeDCGM{}, wantErr: "not an integer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := testDeps(t, inventory.Inventory{PCI: tc.pci})
			d.Diag = tc.runner
			res, err, _ := run(t, NewCommands(d), KindDiag, tc.args)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if got := strings.Join(tc.runner.args, " "); got != tc.wantCommand {
				t.Errorf("ran %q, want %q", got, tc.wantCommand)
			}
			if tc.wantResult == "" {
				return
			}
			var got struct {
				Result string `json:"result"`
				Status string `json:"status"`
				GPUs   []string
			}
			if err := json.Unmarshal(res, &got); err != nil {
				t.Fatalf("%v: %s", err, res)
			}
			if got.Result != tc.wantResult {
				t.Fatalf("result %s", res)
			}
			if tc.wantResult == "not applicable" && got.Status != string(diag.StatusNotApplicable) {
				t.Fatalf("status %s", res)
			}
		})
	}
}

func TestPanicFailsTheCommand(t *testing.T) {
	d := testDeps(t, inventory.Inventory{Disks: []inventory.Disk{{Name: "vda", Path: "/dev/vda", Serial: "A"}}})
	d.OpenTarget = nil // a build without an image target: deploy.image panics on it
	args := `{"image":"x","url":"http://127.0.0.1:1/x","sha256":"` + strings.Repeat("0", 64) + `","rootDeviceHints":{"serial":"A"}}`
	_, err, _ := run(t, NewCommands(d), KindDeploy, args)
	if err == nil || !strings.Contains(err.Error(), "deploy.image: internal error") {
		t.Fatalf("err = %v", err)
	}
}

func TestThrottle(t *testing.T) {
	var got []int64
	r := throttle(func(p agentlink.Progress) { got = append(got, p.Done) }, time.Hour)
	for i := int64(1); i <= 10; i++ {
		r(agentlink.Progress{Done: i, Total: 10})
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 10 {
		t.Fatalf("reported %v, want the first and the completion", got)
	}
}

// The wipe result's bytes are what the node signs: fixed field order, no maps, no nulls.
func TestWipeResultEncoding(t *testing.T) {
	disks := []inventory.Disk{{Name: "sda", Path: "/dev/sda"}}
	results := []wipe.Result{{Device: "sda", Serial: "S1", Mode: wipe.ModeQuick, Method: wipe.MethodQuickZero,
		Verification: wipe.Verification{AllZero: true, Passed: true, FirstNonZero: -1}}}
	a, err := json.Marshal(NewWipeResult(wipe.ModeQuick, disks, results, nil))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(NewWipeResult(wipe.ModeQuick, disks, results, nil))
	if !bytes.Equal(a, b) {
		t.Fatal("two encodings differ")
	}
	want := `{"mode":"quick","disks":[{"device":"/dev/sda","name":"sda","verified":true,"serial":"S1","wwn":"","sizeBytes":0,"mode":"quick",`
	if !strings.HasPrefix(string(a), want) || strings.Contains(string(a), "null") || !strings.Contains(string(a), `"method":"write-zeros-signatures"`) ||
		!strings.HasSuffix(string(a), `"skipped":[]}`) {
		t.Fatalf("encoding %s", a)
	}
	c, _ := json.Marshal(NewWipeResult(wipe.ModeQuick, disks, results, []SkippedDisk{{Name: "sr0", Reason: "optical drive"}}))
	if !strings.HasSuffix(string(c), `,"skipped":[{"name":"sr0","reason":"optical drive"}]}`) {
		t.Fatalf("skipped devices: %s", c)
	}
	results[0].Verification.Passed = false
	if r := NewWipeResult(wipe.ModeQuick, disks, results, nil); r.Disks[0].Verified {
		t.Fatal("verified without a passed read-back")
	}
}

// A mass-storage controller without a driver hides its disks: the wipe refuses, naming it. The
// lab's q35 VMs (ICH9 AHCI, virtio-blk or NVMe, virtio NIC and RNG; host bridge, LPC and SMBus
// without drivers) and the inventory's fixtures pass.
func TestCheckStorageControllers(t *testing.T) {
	q35 := []inventory.PCIDevice{
		{Address: "0000:00:00.0", Vendor: "8086", Device: "29c0", Class: "060000"},
		{Address: "0000:00:01.0", Vendor: "1af4", Device: "1000", Class: "020000", Driver: "virtio-pci"},
		{Address: "0000:00:02.0", Vendor: "1af4", Device: "1001", Class: "010000", Driver: "virtio-pci"},
		{Address: "0000:00:03.0", Vendor: "1b36", Device: "0010", Class: "010802", Driver: "nvme"},
		{Address: "0000:00:04.0", Vendor: "1af4", Device: "1005", Class: "00ff00", Driver: "virtio-pci"},
		{Address: "0000:00:1f.0", Vendor: "8086", Device: "2918", Class: "060100"},
		{Address: "0000:00:1f.2", Vendor: "8086", Device: "2922", Class: "010601", Driver: "ahci"},
		{Address: "0000:00:1f.3", Vendor: "8086", Device: "2930", Class: "0c0500"},
	}
	fixture := func(name string) []inventory.PCIDevice {
		base := filepath.Join("..", "inventory", "testdata", name)
		inv, err := inventory.Collect(t.Context(), inventory.Roots{Sys: filepath.Join(base, "sys"), Proc: filepath.Join(base, "proc"), Dev: filepath.Join(base, "dev")}, inventory.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return inv.PCI
	}
	tests := []struct {
		name string
		pci  []inventory.PCIDevice
		want []string // substrings of the error; nil: no error
	}{
		{"lab q35", q35, nil},
		{"vm fixture", fixture("vm"), nil},
		{"server fixture", fixture("server"), nil},
		{"no PCI bus", nil, nil},
		{"SAS HBA without driver", append(slices.Clone(q35), inventory.PCIDevice{Address: "0000:5e:00.0", Vendor: "1000", Device: "0097", Class: "010700"}),
			[]string{"SAS controller 0000:5e:00.0 (PCI 1000:0097, class 010700) has no driver bound", "cannot be wiped by this ramdisk"}},
		{"RAID and VMD without drivers", []inventory.PCIDevice{
			{Address: "0000:18:00.0", Vendor: "1000", Device: "10e2", Class: "010400"},
			{Address: "0000:64:00.5", Vendor: "8086", Device: "28c0", Class: "010400"},
			{Address: "0000:00:1f.2", Vendor: "8086", Device: "a352", Class: "010601", Driver: "ahci"},
		}, []string{"RAID controller 0000:18:00.0 (PCI 1000:10e2", "RAID controller 0000:64:00.5 (PCI 8086:28c0"}},
		{"IDE without driver", []inventory.PCIDevice{{Address: "0000:00:01.1", Vendor: "8086", Device: "7010", Class: "010180"}},
			[]string{"IDE controller 0000:00:01.1"}},
		{"odd subclass", []inventory.PCIDevice{{Address: "0000:00:05.0", Vendor: "abcd", Device: "0001", Class: "01ee00"}},
			[]string{"mass storage controller 0000:00:05.0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckStorageControllers(tt.pci)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want %q in it", err, w)
				}
			}
		})
	}
}

// TestDiskWipeRechecksTheDisks: the disks are listed again once the wipe is over. A disk that
// appeared meanwhile (hot-plugged, or behind a controller that was slow to bring its disks up)
// was not wiped, and a disk whose identity changed under its name was not the one the result
// names: either must fail the wipe, in the error and in the signed result, never pass as erased.
func TestDiskWipeRechecksTheDisks(t *testing.T) {
	tests := []struct {
		name         string
		after        func(inv inventory.Inventory, extra inventory.Disk) inventory.Inventory
		afterErr     error
		wantErr      string
		wantVerified map[string]bool // by disk name, every disk of the result
		wantSkipped  []string
	}{
		{name: "unchanged", after: func(inv inventory.Inventory, _ inventory.Disk) inventory.Inventory { return inv },
			wantVerified: map[string]bool{"sda": true, "nvme0n1": true}},
		{name: "a disk appeared", after: func(inv inventory.Inventory, extra inventory.Disk) inventory.Inventory {
			inv.Disks = append(slices.Clone(inv.Disks), extra)
			return inv
		}, wantErr: "sdd appeared during the wipe", wantVerified: map[string]bool{"sda": true, "nvme0n1": true, "sdd": false}},
		{name: "a disk was swapped under its name", after: func(inv inventory.Inventory, _ inventory.Disk) inventory.Inventory {
			inv.Disks = slices.Clone(inv.Disks)
			inv.Disks[0].Serial = "S-other"
			return inv
		}, wantErr: "sda changed during the wipe", wantVerified: map[string]bool{"sda": false, "nvme0n1": true}},
		{name: "a disk changed size", after: func(inv inventory.Inventory, _ inventory.Disk) inventory.Inventory {
			inv.Disks = slices.Clone(inv.Disks)
			inv.Disks[1].SizeBytes *= 2
			return inv
		}, wantErr: "nvme0n1 changed during the wipe", wantVerified: map[string]bool{"sda": true, "nvme0n1": false}},
		{name: "a disk disappeared", after: func(inv inventory.Inventory, _ inventory.Disk) inventory.Inventory {
			inv.Disks = inv.Disks[:1]
			return inv
		}, wantErr: "nvme0n1 disappeared during the wipe", wantVerified: map[string]bool{"sda": true, "nvme0n1": false}},
		{name: "read-only media appeared", after: func(inv inventory.Inventory, _ inventory.Disk) inventory.Inventory {
			inv.Disks = append(slices.Clone(inv.Disks), inventory.Disk{Name: "sr1", Removable: true, ReadOnly: true, SizeBytes: 1 << 20})
			return inv
		}, wantVerified: map[string]bool{"sda": true, "nvme0n1": true}, wantSkipped: []string{"sr1"}},
		{name: "inventory unreadable afterwards", afterErr: errors.New("sysfs gone"),
			wantErr: "sysfs gone", wantVerified: map[string]bool{"sda": false, "nvme0n1": false}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv := inventory.Inventory{Disks: []inventory.Disk{fileDisk(t, "sda", 2*mib), fileDisk(t, "nvme0n1", 3*mib)}}
			extra := fileDisk(t, "sdd", 2*mib)
			var mu sync.Mutex
			calls := 0
			d := testDeps(t, inv)
			d.Inventory = func(context.Context) (inventory.Inventory, error) {
				mu.Lock()
				defer mu.Unlock()
				calls++
				if calls == 1 {
					return inv, nil
				}
				if tc.afterErr != nil {
					return inventory.Inventory{}, tc.afterErr
				}
				return tc.after(inv, extra), nil
			}
			res, err, _ := run(t, NewCommands(d), KindWipe, `{"mode":"quick"}`)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			var got struct {
				Disks   []wipeDisk    `json:"disks"`
				Skipped []SkippedDisk `json:"skipped"`
			}
			if err := json.Unmarshal(res, &got); err != nil {
				t.Fatalf("%v: %s", err, res)
			}
			verified := map[string]bool{}
			for _, gd := range got.Disks {
				verified[gd.Name] = gd.Verified
				if !gd.Verified && gd.Error == "" {
					t.Errorf("%s not verified and no error says why", gd.Name)
				}
			}
			if !reflect.DeepEqual(verified, tc.wantVerified) {
				t.Errorf("verified = %v, want %v: %s", verified, tc.wantVerified, res)
			}
			var skipped []string
			for _, s := range got.Skipped {
				skipped = append(skipped, s.Name)
			}
			if !slices.Equal(skipped, tc.wantSkipped) {
				t.Errorf("skipped = %v, want %v", skipped, tc.wantSkipped)
			}
			// What the control plane reads: every disk verified only when the command passed.
			var cp engine.WipeResult
			if err := json.Unmarshal(res, &cp); err != nil {
				t.Fatal(err)
			}
			all := len(cp.Disks) > 0
			for _, d := range cp.Disks {
				all = all && d.Verified
			}
			if all != (err == nil) {
				t.Errorf("the control plane sees every disk verified = %t, the command's error = %v", all, err)
			}
		})
	}
}
