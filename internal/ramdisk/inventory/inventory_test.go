package inventory

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func fixtureRoots(name string) Roots {
	base := filepath.Join("testdata", name)
	return Roots{Sys: filepath.Join(base, "sys"), Proc: filepath.Join(base, "proc"), Dev: filepath.Join(base, "dev")}
}

func TestCollectVirtioVM(t *testing.T) {
	r := fixtureRoots("vm")
	inv, err := Collect(context.Background(), r, Options{})
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	wantCPU := CPU{Model: "QEMU Virtual CPU version 2.5+", Sockets: 1, Cores: 2, Threads: 2, Flags: []string{"hypervisor", "lm", "nx"}}
	if !reflect.DeepEqual(inv.CPU, wantCPU) {
		t.Errorf("CPU = %+v, want %+v", inv.CPU, wantCPU)
	}
	if inv.Memory.TotalBytes != 2030700*1024 {
		t.Errorf("memory = %d", inv.Memory.TotalBytes)
	}
	wantDisks := []Disk{{
		Name: "vda", Path: filepath.Join(r.Dev, "vda"), Serial: "bcd-vm-disk-0", SizeBytes: 41943040 * 512,
		LogicalBlockSize: 512, PhysicalBlockSize: 512, Rotational: true, Transport: TransportVirtio,
		ByPath: "pci-0000:00:04.0", PCIAddress: "0000:00:04.0",
	}}
	if !reflect.DeepEqual(inv.Disks, wantDisks) {
		t.Errorf("disks =\n%+v\nwant\n%+v", inv.Disks, wantDisks)
	}
	wantNICs := []NIC{{
		Name: "eth0", MAC: "52:54:00:12:34:56", Driver: "virtio_net", Carrier: true, PCIAddress: "0000:00:03.0",
		Modalias: "pci:v00001AF4d00001000sv00001AF4sd00000001bc02sc00i00",
	}}
	if !reflect.DeepEqual(inv.NICs, wantNICs) {
		t.Errorf("nics =\n%+v\nwant\n%+v", inv.NICs, wantNICs)
	}
	wantSkipped := []Skipped{
		{Kind: "disk", Name: "loop0", Reason: "loop device"},
		{Kind: "disk", Name: "zram0", Reason: "compressed RAM disk"},
		{Kind: "nic", Name: "lo", Reason: "loopback"},
	}
	if !reflect.DeepEqual(inv.Skipped, wantSkipped) {
		t.Errorf("skipped = %+v, want %+v", inv.Skipped, wantSkipped)
	}
	if inv.BootMode != BootBIOS {
		t.Errorf("boot mode = %q", inv.BootMode)
	}
	if inv.DMI.ProductUUID != "6a1c0b9e-2f3d-4e5a-8b7c-9d0e1f2a3b4c" || inv.DMI.SysVendor != "QEMU" || inv.DMI.BIOSVendor != "SeaBIOS" {
		t.Errorf("dmi = %+v", inv.DMI)
	}
	if len(inv.PCI) != 3 || !inv.PCI[0].GPU || inv.PCI[0].NVIDIA || inv.HasNVIDIAGPU() {
		t.Errorf("pci = %+v", inv.PCI)
	}
	if len(inv.FirmwareHints) != 0 {
		t.Errorf("firmware hints = %+v, want none", inv.FirmwareHints)
	}
}

func TestCollectVirtioVMIncludeVirtual(t *testing.T) {
	inv, err := Collect(context.Background(), fixtureRoots("vm"), Options{IncludeVirtualDisks: true})
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	var names []string
	for _, d := range inv.Disks {
		names = append(names, d.Name)
	}
	if !slices.Equal(names, []string{"loop0", "vda"}) {
		t.Errorf("disks = %v, want loop0 and vda", names)
	}
	want := []Skipped{{Kind: "disk", Name: "zram0", Reason: "no medium (size 0)"}, {Kind: "nic", Name: "lo", Reason: "loopback"}}
	if !reflect.DeepEqual(inv.Skipped, want) {
		t.Errorf("skipped = %+v, want %+v", inv.Skipped, want)
	}
}

func TestCollectServer(t *testing.T) {
	r := fixtureRoots("server")
	nicFirmware := map[string]string{"eno1": "bc 7.10.4 NCSI 2.0.11", "ens2f0np0": "16.35.2000 (MT_0000000080)", "br0": "bridge", "lo": "loopback"}
	inv, err := Collect(context.Background(), r, Options{NICFirmware: func(name string) string { return nicFirmware[name] }})
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	wantCPU := CPU{
		Model: "Intel(R) Xeon(R) Silver 4214 CPU @ 2.20GHz", Sockets: 2, Cores: 4, Threads: 8,
		Flags: []string{"aes", "avx", "avx2", "avx512f", "lm", "nx", "pdpe1gb", "sha_ni", "sse4_2", "vmx"},
	}
	if !reflect.DeepEqual(inv.CPU, wantCPU) {
		t.Errorf("CPU = %+v, want %+v", inv.CPU, wantCPU)
	}
	if inv.Memory.TotalBytes != 196608000*1024 {
		t.Errorf("memory = %d", inv.Memory.TotalBytes)
	}
	wantDisks := []Disk{
		{
			Name: "nvme0n1", Path: filepath.Join(r.Dev, "nvme0n1"), Model: "Samsung SSD 970 EVO Plus 1TB",
			Serial: "S4EWNX0R123456A", WWN: "eui.0025388b91b12345", SizeBytes: 1953525168 * 512,
			LogicalBlockSize: 512, PhysicalBlockSize: 512, Transport: TransportNVMe,
			ByPath: "pci-0000:3b:00.0-nvme-1", PCIAddress: "0000:3b:00.0", Firmware: "2B2QEXM7",
		},
		{
			Name: "sda", Path: filepath.Join(r.Dev, "sda"), Model: "ST4000NM0035-1V4", Serial: "ZC18ABCD",
			WWN: "naa.50000c5000010203", SizeBytes: 7814037168 * 512, LogicalBlockSize: 512, PhysicalBlockSize: 4096,
			Rotational: true, Transport: TransportSATA, ByPath: "pci-0000:00:17.0-ata-3.0", PCIAddress: "0000:00:17.0",
			Firmware: "TN04",
		},
		{
			Name: "sdb", Path: filepath.Join(r.Dev, "sdb"), Model: "Ultra Fit", SizeBytes: 60063744 * 512,
			LogicalBlockSize: 512, PhysicalBlockSize: 512, Rotational: true, Removable: true, Transport: TransportUSB,
			ByPath: "pci-0000:00:14.0", PCIAddress: "0000:00:14.0", Firmware: "1.00",
		},
	}
	if !reflect.DeepEqual(inv.Disks, wantDisks) {
		t.Errorf("disks =\n%+v\nwant\n%+v", inv.Disks, wantDisks)
	}
	wantNICs := []NIC{
		{Name: "eno1", MAC: "b8:2a:72:dc:0a:01", Driver: "bnx2", SpeedMbps: 1000, Carrier: true, PCIAddress: "0000:01:00.0",
			Modalias: "pci:v000014E4d0000163Bsv00001028sd000002DCbc02sc00i00", Firmware: "bc 7.10.4 NCSI 2.0.11"},
		{Name: "ens2f0np0", MAC: "0c:42:a1:00:00:10", Driver: "mlx5_core", PCIAddress: "0000:5e:00.0",
			Modalias: "pci:v000015B3d00001017sv000015B3sd00000020bc02sc00i00", Firmware: "16.35.2000 (MT_0000000080)"},
	}
	if !reflect.DeepEqual(inv.NICs, wantNICs) {
		t.Errorf("nics =\n%+v\nwant\n%+v", inv.NICs, wantNICs)
	}
	wantSkipped := []Skipped{
		{Kind: "disk", Name: "dm-0", Reason: "device-mapper volume"},
		{Kind: "disk", Name: "sr0", Reason: "optical drive"},
		{Kind: "nic", Name: "br0", Reason: "virtual interface (no backing device)"},
		{Kind: "nic", Name: "lo", Reason: "loopback"},
	}
	if !reflect.DeepEqual(inv.Skipped, wantSkipped) {
		t.Errorf("skipped = %+v, want %+v", inv.Skipped, wantSkipped)
	}
	if inv.BootMode != BootUEFI {
		t.Errorf("boot mode = %q", inv.BootMode)
	}
	wantDMI := DMI{
		ProductUUID: "00000000-0000-0000-0000-ac1f6b123456", ProductSerial: "S123456X9", ProductName: "SYS-1029P-WTR",
		SysVendor: "Supermicro", BoardSerial: "OM19BS000123", BIOSVendor: "American Megatrends Inc.", BIOSVersion: "3.4", BIOSDate: "11/22/2020",
	}
	if inv.DMI != wantDMI {
		t.Errorf("dmi = %+v, want %+v", inv.DMI, wantDMI)
	}
	if !inv.HasNVIDIAGPU() {
		t.Error("NVIDIA GPU not flagged")
	}
	var gpus []string
	for _, d := range inv.PCI {
		if d.GPU {
			gpus = append(gpus, d.Address+"/"+d.Vendor+"/"+d.Class)
		}
	}
	if !slices.Equal(gpus, []string{"0000:af:00.0/10de/030200"}) {
		t.Errorf("gpus = %v", gpus)
	}
	wantHints := []FirmwareHint{
		{Device: "eno1", Driver: "bnx2", Package: "firmware-bnx2", Reason: "driver bnx2"},
		{Device: "0000:02:00.0", Package: "firmware-realtek", Reason: "modalias pci:v000010EC*bc02*"},
	}
	if !reflect.DeepEqual(inv.FirmwareHints, wantHints) {
		t.Errorf("hints = %+v, want %+v", inv.FirmwareHints, wantHints)
	}
}

// The JSON field names are a wire contract with the control plane.
func TestInventoryJSONFieldNames(t *testing.T) {
	inv, err := Collect(context.Background(), fixtureRoots("server"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"bootMode", "cpu", "disks", "dmi", "firmwareHints", "memory", "nics", "pci", "skipped"}
	if !slices.Equal(keys, want) {
		t.Errorf("top-level keys = %v, want %v", keys, want)
	}
	var disks []map[string]any
	if err := json.Unmarshal(m["disks"], &disks); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "path", "model", "serial", "wwn", "sizeBytes", "logicalBlockSize", "physicalBlockSize", "rotational", "removable", "transport", "byPath"} {
		if _, ok := disks[0][k]; !ok {
			t.Errorf("disk JSON lacks %q", k)
		}
	}
	var back Inventory
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, inv) {
		t.Errorf("JSON round trip differs (err %v)", err)
	}
}

func TestCollectErrors(t *testing.T) {
	tests := []struct {
		name  string
		roots Roots
	}{
		{"no proc", Roots{Sys: "testdata/vm/sys", Proc: "testdata/nonexistent", Dev: "testdata/vm/dev"}},
		{"no sys", Roots{Sys: "testdata/nonexistent", Proc: "testdata/vm/proc", Dev: "testdata/vm/dev"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Collect(context.Background(), tt.roots, Options{}); err == nil {
				t.Fatal("want an error")
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Collect(ctx, fixtureRoots("vm"), Options{}); err == nil {
		t.Error("cancelled context: want an error")
	}
}

func TestParseCPUInfo(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want CPU
	}{
		{"empty", "", CPU{}},
		{"arm without topology", "processor\t: 0\nFeatures\t: fp asimd aes\n\nprocessor\t: 1\nFeatures\t: fp asimd aes\n",
			CPU{Sockets: 1, Cores: 2, Threads: 2, Flags: []string{"aes"}}},
		{"garbage lines", "nonsense\n:::\nprocessor : 0\nmodel name : X\n", CPU{Model: "X", Sockets: 1, Cores: 1, Threads: 1}},
		{"hyperthreads share a core", "processor: 0\nphysical id: 0\ncore id: 0\n\nprocessor: 1\nphysical id: 0\ncore id: 0\n",
			CPU{Sockets: 1, Cores: 1, Threads: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParseCPUInfo(tt.in); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestClassifyTransportAndByPath(t *testing.T) {
	tests := []struct {
		name, devPath string
		want          Transport
		byPath        string
	}{
		{"nvme0n1", "/devices/pci0000:00/0000:3b:00.0/nvme/nvme0/nvme0n1", TransportNVMe, "pci-0000:3b:00.0-nvme-1"},
		{"nvme1n2", "/devices/pci0000:00/0000:00:1d.0/0000:3c:00.0/nvme/nvme1/nvme1n2", TransportNVMe, "pci-0000:3c:00.0-nvme-2"},
		{"sda", "/devices/pci0000:00/0000:00:17.0/ata3/host2/target2:0:0/2:0:0:0/block/sda", TransportSATA, "pci-0000:00:17.0-ata-3"},
		{"sdc", "/devices/pci0000:00/0000:00:03.0/0000:02:00.0/host0/port-0:0/end_device-0:0/target0:0:0/0:0:0:0/block/sdc", TransportSAS, "pci-0000:02:00.0-scsi-0:0:0:0"},
		{"sdd", "/devices/pci0000:00/0000:00:14.0/usb1/1-4/1-4:1.0/host6/target6:0:0/6:0:0:0/block/sdd", TransportUSB, "pci-0000:00:14.0"},
		{"vda", "/devices/pci0000:00/0000:00:04.0/virtio1/block/vda", TransportVirtio, "pci-0000:00:04.0"},
		{"sde", "/devices/pci0000:00/0000:00:05.0/virtio2/host0/target0:0:1/0:0:1:0/block/sde", TransportVirtio, "pci-0000:00:05.0-scsi-0:0:1:0"},
		{"sdf", "/devices/pci0000:00/0000:00:10.0/host3/target3:0:0/3:0:0:0/block/sdf", TransportSCSI, "pci-0000:00:10.0-scsi-3:0:0:0"},
		{"mmcblk0", "/devices/platform/mmc0/mmc_host/mmc0/mmc0:0001/block/mmcblk0", TransportMMC, ""},
		{"xyz", "/devices/platform/xyz", TransportUnknown, ""},
		{"bad", "", TransportUnknown, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ClassifyTransport(tt.name, tt.devPath)
			if got != tt.want {
				t.Errorf("transport = %q, want %q", got, tt.want)
			}
			if bp := ByPath(tt.name, got, tt.devPath); bp != tt.byPath {
				t.Errorf("by-path = %q, want %q", bp, tt.byPath)
			}
		})
	}
}

func TestParseVPD(t *testing.T) {
	tests := []struct {
		name    string
		pg80    []byte
		pg83    []byte
		wantSer string
		wantWWN string
	}{
		{"empty", nil, nil, "", ""},
		{"wrong page", []byte{0, 0x83, 0, 2, 'a', 'b'}, []byte{0, 0x80, 0, 0}, "", ""},
		{"serial with padding", []byte{0, 0x80, 0, 6, ' ', 'A', 'B', 'C', ' ', ' '}, nil, "ABC", ""},
		{"length beyond data", []byte{0, 0x80, 0, 99, 'X', 'Y'}, nil, "XY", ""},
		{"naa after vendor id", nil, []byte{0, 0x83, 0, 16, 2, 1, 0, 4, 'A', 'T', 'A', ' ', 1, 3, 0, 4, 0x50, 1, 2, 3}, "", "naa.50010203"},
		{"eui only", nil, []byte{0, 0x83, 0, 8, 1, 2, 0, 4, 0xde, 0xad, 0xbe, 0xef}, "", "eui.deadbeef"},
		{"truncated designator", nil, []byte{0, 0x83, 0, 8, 1, 3, 0, 40, 1, 2}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseVPD80(tt.pg80); got != tt.wantSer {
				t.Errorf("serial = %q, want %q", got, tt.wantSer)
			}
			if got := parseVPD83(tt.pg83); got != tt.wantWWN {
				t.Errorf("wwn = %q, want %q", got, tt.wantWWN)
			}
		})
	}
}

// Smoke test on this machine's own /sys and /proc.
func TestCollectRealSystem(t *testing.T) {
	if _, err := os.Stat("/sys/block"); err != nil {
		t.Skip("no /sys/block here")
	}
	inv, err := Collect(context.Background(), Roots{}, Options{})
	if err != nil {
		t.Fatalf("Collect on the real system: %v", err)
	}
	if inv.CPU.Threads == 0 || inv.Memory.TotalBytes == 0 {
		t.Errorf("implausible inventory: cpu %+v memory %+v", inv.CPU, inv.Memory)
	}
	t.Logf("disks %d, nics %d, pci %d, skipped %d, boot %s", len(inv.Disks), len(inv.NICs), len(inv.PCI), len(inv.Skipped), inv.BootMode)
}

// The firmware-version field of an ethtool answer: NUL-terminated, padded, "N/A" for none.
func TestFirmwareVersion(t *testing.T) {
	field := func(s string) []byte {
		b := make([]byte, 32)
		copy(b, s)
		return b
	}
	for _, c := range []struct {
		in   []byte
		want string
	}{
		{field("16.35.2000 (MT_0000000080)"), "16.35.2000 (MT_0000000080)"},
		{field("bc 7.10.4 NCSI 2.0.11"), "bc 7.10.4 NCSI 2.0.11"},
		{field("N/A"), ""},
		{field("n/a"), ""},
		{field(""), ""},
		{field(" 1.2 "), "1.2"},
		{[]byte("1.0\x00garbage"), "1.0"},
		{[]byte("no-terminator"), "no-terminator"},
	} {
		if got := firmwareVersion(c.in); got != c.want {
			t.Errorf("firmwareVersion(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// NVMe native multipath lists each path (nvme0c0n1, hidden, no /dev node) beside the multipath
// head (nvme0n1): the head is the disk, a path is skipped with its reason.
func TestHiddenNVMePathSkipped(t *testing.T) {
	root := t.TempDir()
	write := func(p, c string) {
		t.Helper()
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/cpuinfo", "processor\t: 0\n")
	write("proc/meminfo", "MemTotal: 1024 kB\n")
	write("sys/class/net/.keep", "")
	write("dev/nvme0n1", "")
	head := "sys/devices/virtual/nvme-subsystem/nvme-subsys0/nvme0n1"
	paths := []string{"sys/devices/pci0000:00/0000:3b:00.0/nvme/nvme0/nvme0c0n1", "sys/devices/pci0000:00/0000:5e:00.0/nvme/nvme1/nvme0c1n1"}
	write(head+"/size", "8192\n")
	write(head+"/hidden", "0\n")
	links := map[string]string{"nvme0n1": head}
	for _, p := range paths {
		write(p+"/size", "8192\n")
		write(p+"/hidden", "1\n")
		links[filepath.Base(p)] = p
	}
	if err := os.MkdirAll(filepath.Join(root, "sys/block"), 0o755); err != nil {
		t.Fatal(err)
	}
	for n, target := range links {
		if err := os.Symlink(filepath.Join("..", "..", target), filepath.Join(root, "sys/block", n)); err != nil {
			t.Fatal(err)
		}
	}
	inv, err := Collect(t.Context(), Roots{Sys: filepath.Join(root, "sys"), Proc: filepath.Join(root, "proc"), Dev: filepath.Join(root, "dev")}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Disks) != 1 || inv.Disks[0].Name != "nvme0n1" || inv.Disks[0].SizeBytes != 8192*512 || inv.Disks[0].Transport != TransportNVMe {
		t.Errorf("disks = %+v, want the multipath head nvme0n1 only", inv.Disks)
	}
	var skipped []string
	for _, s := range inv.Skipped {
		if s.Kind == "disk" {
			skipped = append(skipped, s.Name)
			if s.Reason == "" || !strings.Contains(s.Reason, "multipath") {
				t.Errorf("skipped %s without saying why: %q", s.Name, s.Reason)
			}
		}
	}
	if !slices.Equal(skipped, []string{"nvme0c0n1", "nvme0c1n1"}) {
		t.Errorf("skipped disks = %v, want both paths", skipped)
	}
}
