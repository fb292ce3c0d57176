package hardware

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"bcd/internal/ramdisk/inventory"
)

// A GPU server as a ramdisk reports it: two sockets, 512 GiB, two NVMe disks and a SATA SSD, a
// USB stick and a read-only virtual CD (not counted), two NVIDIA GPUs and a BMC's display
// controller, a 25 Gbit/s link up and a 100 Gbit/s one down.
func gpuServer() inventory.Inventory {
	return inventory.Inventory{
		CPU:    inventory.CPU{Model: "AMD EPYC 9354", Sockets: 2, Cores: 64, Threads: 128, Flags: []string{"avx2", "avx512f", "svm"}},
		Memory: inventory.Memory{TotalBytes: 512 << 30},
		Disks: []inventory.Disk{
			{Name: "nvme0n1", SizeBytes: 3840e9, Transport: inventory.TransportNVMe},
			{Name: "nvme1n1", SizeBytes: 3840e9, Transport: inventory.TransportNVMe},
			{Name: "sda", SizeBytes: 480e9, Transport: inventory.TransportSATA},
			{Name: "sdb", SizeBytes: 32e9, Transport: inventory.TransportUSB, Removable: true},
			{Name: "sr0", SizeBytes: 1e9, ReadOnly: true, Rotational: true},
		},
		NICs: []inventory.NIC{{Name: "eno1", SpeedMbps: 25000, Carrier: true}, {Name: "ens1f0", SpeedMbps: 100000}},
		PCI: []inventory.PCIDevice{
			{Address: "0000:41:00.0", GPU: true, NVIDIA: true}, {Address: "0000:c1:00.0", GPU: true, NVIDIA: true},
			{Address: "0000:03:00.0", GPU: true}, {Address: "0000:01:00.0"},
		},
		DMI:      inventory.DMI{SysVendor: "Dell Inc.", ProductName: "PowerEdge XE8640"},
		BootMode: inventory.BootUEFI,
	}
}

func TestSummarize(t *testing.T) {
	for _, c := range []struct {
		name string
		inv  inventory.Inventory
		want Facts
	}{
		{"a GPU server", gpuServer(), Facts{CPUModel: "AMD EPYC 9354", Sockets: 2, Cores: 64, Threads: 128, CPUFlags: []string{"avx2", "avx512f", "svm"},
			MemoryBytes: 512 << 30, Disks: 3, DiskBytes: 8160e9, LargestDiskBytes: 3840e9, SSDs: 3, NVMe: 2, GPUs: 3, NVIDIAGPUs: 2, NICs: 2,
			FastestNICMbps: 25000, BootMode: "uefi", Vendor: "Dell Inc.", Product: "PowerEdge XE8640"}},
		{"nothing reported", inventory.Inventory{}, Facts{CPUFlags: []string{}}},
		{"a rotating disk and no link up", inventory.Inventory{Disks: []inventory.Disk{{SizeBytes: 8e12, Rotational: true, Transport: inventory.TransportSAS}},
			NICs: []inventory.NIC{{SpeedMbps: 10000}}, BootMode: inventory.BootBIOS},
			Facts{CPUFlags: []string{}, Disks: 1, DiskBytes: 8e12, LargestDiskBytes: 8e12, NICs: 1, BootMode: "bios"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Summarize(c.inv); !reflect.DeepEqual(got, c.want) {
				t.Errorf("Summarize:\n got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestParseBytes(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
		err  string
	}{
		{"0", 0, ""},
		{"4096", 4096, ""},
		{"256GiB", 256 << 30, ""},
		{"256 GiB", 256 << 30, ""},
		{"1.5TB", 1.5e12, ""},
		{"1.5TiB", 3 << 39, ""},
		{"2kB", 2000, ""},
		{"2KB", 2000, ""},
		{"3PiB", 3 << 50, ""},
		{"16EiB", 0, "unknown unit"},
		{"256G", 0, "unknown unit"},
		{"256gib", 0, "unknown unit"},
		{"1.5", 0, "write a number and a unit"},
		{"-1GB", 0, "write a number and a unit"},
		{"1e3GB", 0, "write a number and a unit"},
		{"0x10GB", 0, "write a number and a unit"},
		{"GiB", 0, "write a number and a unit"},
		{"", 0, "write a number and a unit"},
		{"18446744073709551615", 1<<64 - 1, ""},
		{"18446744073709551615KiB", 0, "too large"},
		{"99999999999PiB", 0, "too large"},
	} {
		got, err := ParseBytes(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseBytes(%q) = %d, %v: want an error with %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseBytes(%q) = %d, %v: want %d", c.in, got, err, c.want)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for in, want := range map[uint64]string{0: "0B", 1023: "1023B", 1024: "1KiB", 512 << 30: "512GiB", 3840e9: "3.5TiB", 1536: "1.5KiB", 1<<64 - 1: "16384PiB"} {
		if got := FormatBytes(in); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in, want, err string
	}{
		{in: "memory>=256GiB", want: "memory>=274877906944"},
		{in: " gpus.nvidia >= 2 ", want: "gpus.nvidia>=2"},
		{in: "cpu.cores>32", want: "cpu.cores>32"},
		{in: "disks<=4", want: "disks<=4"},
		{in: "disks.nvme<1", want: "disks.nvme<1"},
		{in: "nic.mbps=25000", want: "nic.mbps=25000"},
		{in: "disk.largest!=0", want: "disk.largest!=0"},
		{in: "boot=uefi", want: "boot=uefi"},
		{in: "vendor!=Dell Inc.", want: "vendor!=Dell Inc."},
		{in: "product=A=B", want: "product=A=B"},
		{in: "cpu.flag=avx512f", want: "cpu.flag=avx512f"},
		{in: "memory", err: "has no operator"},
		{in: "memory 256GiB", err: "has no operator"},
		{in: "ram>=256GiB", err: `unknown key "ram": accepted are cpu.sockets, cpu.cores`},
		{in: ">=2", err: `unknown key ""`},
		{in: "boot>=uefi", err: "boot takes = != only"},
		{in: "cpu.flag<avx", err: "cpu.flag takes = != only"},
		{in: "gpus>=", err: "has no value after >="},
		{in: "gpus>=two", err: "gpus is counted"},
		{in: "gpus>=-1", err: "gpus is counted"},
		{in: "gpus>=1.5", err: "gpus is counted"},
		{in: "gpus>=4294967296", err: "gpus is counted"},
		{in: "memory>=lots", err: "unknown unit"},
		{in: "vendor=a\nb", err: "control character"},
		{in: "vendor=" + strings.Repeat("x", MaxLength), err: "at most 200"},
	} {
		r, err := Parse(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Parse(%q) = %v, %v: want an error with %q", c.in, r, err, c.err)
			}
			continue
		}
		if err != nil || r.String() != c.want {
			t.Errorf("Parse(%q) = %q, %v: want %q", c.in, r, err, c.want)
		}
	}
	if _, err := ParseAll(make([]string, 33)); err == nil || !strings.Contains(err.Error(), "at most 32") {
		t.Errorf("33 requirements: %v", err)
	}
}

// Every operator of every kind, on the GPU server's facts, each with a value on both sides of the
// machine's and on it.
func TestHolds(t *testing.T) {
	f := Summarize(gpuServer())
	for _, c := range []struct {
		req  string
		want bool
	}{
		{"memory>=512GiB", true}, {"memory>=513GiB", false}, {"memory>512GiB", false}, {"memory>511GiB", true},
		{"memory<=512GiB", true}, {"memory<512GiB", false}, {"memory<1TiB", true}, {"memory=512GiB", true}, {"memory!=512GiB", false},
		{"gpus.nvidia>=2", true}, {"gpus.nvidia>=3", false}, {"gpus=3", true}, {"gpus!=3", false}, {"gpus<3", false}, {"gpus<=3", true}, {"gpus>2", true},
		{"disks=3", true}, {"disks.ssd>=3", true}, {"disks.nvme>=2", true}, {"disks.nvme>2", false},
		{"disk.largest>=3.84TB", true}, {"disk.largest>3.84TB", false}, {"disk.total>=8TB", true},
		{"cpu.sockets=2", true}, {"cpu.cores>=64", true}, {"cpu.threads>128", false},
		{"nics>=2", true}, {"nic.mbps>=25000", true}, {"nic.mbps>=100000", false},
		{"boot=uefi", true}, {"boot=UEFI", true}, {"boot!=uefi", false}, {"boot=bios", false},
		{"vendor=dell inc.", true}, {"vendor!=Dell Inc.", false}, {"product=PowerEdge XE8640", true}, {"product=PowerEdge R650", false},
		{"cpu.flag=avx512f", true}, {"cpu.flag=AVX512F", true}, {"cpu.flag!=avx512f", false}, {"cpu.flag=vmx", false}, {"cpu.flag!=vmx", true},
	} {
		r, err := Parse(c.req)
		if err != nil {
			t.Fatalf("Parse(%q): %v", c.req, err)
		}
		if got := r.Holds(f); got != c.want {
			t.Errorf("%s on the GPU server: %v, want %v", c.req, got, c.want)
		}
	}
	// A machine that reported nothing meets only what zero and "" meet.
	var none Facts
	for req, want := range map[string]bool{"gpus=0": true, "memory>=1B": false, "boot=uefi": false, "boot!=uefi": true, "cpu.flag!=avx2": true} {
		r, _ := Parse(req)
		if got := r.Holds(none); got != want {
			t.Errorf("%s on no facts: %v, want %v", req, got, want)
		}
	}
}

func TestUnmets(t *testing.T) {
	f := Summarize(gpuServer())
	reqs, err := ParseAll([]string{" memory >= 1TiB ", "gpus.nvidia>=2", "boot=bios", "cpu.flag=vmx", "disk.largest>4TB", "vendor!=dell inc."})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"memory >= 1TiB: it has 512GiB", "boot=bios: it has uefi", "cpu.flag=vmx: it has avx2 avx512f svm", "disk.largest>4TB: it has 3.5TiB", "vendor!=dell inc.: it has Dell Inc."}
	if got := Unmets(f, reqs); !reflect.DeepEqual(got, want) {
		t.Errorf("Unmets:\n got %q\nwant %q", got, want)
	}
	if got := Unmets(Facts{}, reqs[2:4]); !reflect.DeepEqual(got, []string{"boot=bios: it has nothing reported", "cpu.flag=vmx: it has none"}) {
		t.Errorf("Unmets of nothing reported: %q", got)
	}
}

func TestUnmet(t *testing.T) {
	f := Summarize(gpuServer())
	reqs, err := ParseAll([]string{"memory>=256GiB", "gpus.nvidia>=4", "boot=bios"})
	if err != nil {
		t.Fatal(err)
	}
	if r, ok := Unmet(f, reqs); !ok || r.String() != "gpus.nvidia>=4" {
		t.Errorf("Unmet = %v, %v: want the first unmet, gpus.nvidia>=4", r, ok)
	}
	if _, ok := Unmet(f, reqs[:1]); ok {
		t.Error("memory>=256GiB is met by 512 GiB")
	}
	if _, ok := Unmet(f, nil); ok {
		t.Error("no requirement is always met")
	}
}

// Every key of the table parses with each operator its kind takes, and none other.
func TestKeysTakeTheirOperators(t *testing.T) {
	for _, k := range Keys() {
		value := map[Kind]string{Count: "1", Bytes: "1GiB", Text: "x", Flag: "x"}[k.Kind]
		for _, op := range operators() {
			_, err := Parse(k.Name + op + value)
			want := strings.Contains(" "+strings.Join(opsOf(k.Kind), " ")+" ", " "+op+" ")
			if (err == nil) != want {
				t.Errorf("%s%s%s: %v, want accepted %v", k.Name, op, value, err, want)
			}
		}
		if (k.num == nil) == (k.Kind == Count || k.Kind == Bytes) || (k.text == nil) == (k.Kind == Text) || (k.set == nil) == (k.Kind == Flag) {
			t.Errorf("key %s: its reader does not fit its kind", k.Name)
		}
	}
}

// A requirement that parses writes itself as one that parses to the same, whatever the text.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"memory>=256GiB", "gpus.nvidia >= 2", "boot=uefi", "cpu.flag!=vmx", "disk.largest<1.5TB", "x", ""} {
		f.Add(s)
	}
	facts := Summarize(gpuServer())
	f.Fuzz(func(t *testing.T, s string) {
		r, err := Parse(s)
		if err != nil {
			return
		}
		again, err := Parse(r.String())
		if err != nil {
			t.Fatalf("Parse(%q) = %q, which does not parse: %v", s, r, err)
		}
		if again.String() != r.String() || again.Holds(facts) != r.Holds(facts) {
			t.Fatalf("Parse(%q) = %q, read again as %q", s, r, again)
		}
	})
}

func TestDiff(t *testing.T) {
	change := func(edit func(*inventory.Inventory)) inventory.Inventory {
		inv := gpuServer()
		inv.Disks = append([]inventory.Disk(nil), inv.Disks...)
		inv.NICs = append([]inventory.NIC(nil), inv.NICs...)
		inv.PCI = append([]inventory.PCIDevice(nil), inv.PCI...)
		inv.Disks[0].Serial, inv.Disks[1].Serial = "S0", "S1"
		inv.NICs[0].MAC, inv.NICs[1].MAC = "b8:ce:f6:00:00:01", "b8:ce:f6:00:00:02"
		edit(&inv)
		return inv
	}
	same := change(func(*inventory.Inventory) {})
	for _, c := range []struct {
		name string
		edit func(*inventory.Inventory)
		want []Change
	}{
		{"nothing", func(*inventory.Inventory) {}, nil},
		{"links and firmware are not hardware", func(inv *inventory.Inventory) {
			inv.NICs[0].Carrier, inv.NICs[0].SpeedMbps, inv.NICs[0].Firmware, inv.Disks[0].Firmware = false, 0, "22.1", "2.0"
		}, nil},
		{"the kernel's share of memory", func(inv *inventory.Inventory) { inv.Memory.TotalBytes -= 64 << 20 }, nil},
		{"a DIMM lost", func(inv *inventory.Inventory) { inv.Memory.TotalBytes -= 32 << 30 },
			[]Change{{"memory", "512GiB", "480GiB"}}},
		{"a disk replaced by a larger one", func(inv *inventory.Inventory) { inv.Disks[1].Serial, inv.Disks[1].SizeBytes = "S9", 7680e9 },
			[]Change{{"disk.total", "8160000000000B", "12000000000000B"}, {"disks.serial", "S1", "S9"}}},
		{"a disk gone", func(inv *inventory.Inventory) { inv.Disks = inv.Disks[1:] },
			[]Change{{"disks", "3", "2"}, {"disk.total", "8160000000000B", "4320000000000B"}, {"disks.serial", "S0", ""}}},
		{"a GPU gone and a NIC swapped", func(inv *inventory.Inventory) {
			inv.PCI = inv.PCI[1:]
			inv.NICs[1].MAC = "B8:CE:F6:00:00:09"
		}, []Change{{"gpus", "3", "2"}, {"gpus.nvidia", "2", "1"}, {"nics.mac", "b8:ce:f6:00:00:02", "b8:ce:f6:00:00:09"}}},
		{"booted another way, a board swapped", func(inv *inventory.Inventory) {
			inv.BootMode, inv.CPU.Model, inv.CPU.Cores, inv.DMI.ProductName = inventory.BootBIOS, "AMD EPYC 9554", 128, "XE9680"
		}, []Change{{"cpu.model", "AMD EPYC 9354", "AMD EPYC 9554"}, {"cpu.cores", "64", "128"}, {"boot", "uefi", "bios"}, {"product", "PowerEdge XE8640", "XE9680"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Diff(same, change(c.edit)); !reflect.DeepEqual(got, c.want) {
				t.Errorf("Diff:\n got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// The operations guide's table of keys names every key.
func TestKeysAreDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Keys() {
		if !strings.Contains(string(b), "`"+k.Name+"`") {
			t.Errorf("docs/operations.md does not name key %s", k.Name)
		}
	}
}
