package cli

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"bcd/internal/gen/bcdv1"
)

// A node's inventory reads as its facts, then a line per disk and per NIC.
func TestPrintInventory(t *testing.T) {
	m := &bcdv1.NodeInventoryResponse{Node: "0190-id", Name: "gpu-01", UpdatedAt: "2026-12-07T00:10:00Z",
		Facts: &bcdv1.HardwareFacts{CpuModel: "AMD EPYC 9354", Sockets: 2, Cores: 64, Threads: 128, CpuFlags: []string{"avx2", "avx512f"}, MemoryBytes: 512 << 30,
			Disks: 1, DiskBytes: 3840e9, LargestDiskBytes: 3840e9, Ssds: 1, Nvme: 1, Gpus: 2, NvidiaGpus: 2, Nics: 2, FastestNicMbps: 25000, BootMode: "uefi",
			Vendor: "Dell Inc.", Product: "PowerEdge XE8640"},
		Inventory: `{"disks":[{"name":"nvme0n1","sizeBytes":3840000000000,"transport":"nvme","model":"PM1733","serial":"S1"},{"name":"sdb","sizeBytes":32000000000,"transport":"usb","removable":true}],` +
			`"nics":[{"name":"eno1","mac":"b8:ce:f6:00:00:01","speedMbps":25000,"carrier":true,"driver":"mlx5_core","firmware":"22.36"},{"name":"eno2","mac":"b8:ce:f6:00:00:02"}]}`}
	var out bytes.Buffer
	if err := printInventory(&out, m); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"node gpu-01 (0190-id), reported 2026-12-07T00:10:00Z\n",
		"cpu     AMD EPYC 9354: 2 sockets, 64 cores, 128 threads (avx2 avx512f)\n",
		"memory  512GiB\n",
		"disks   1, 3.5TiB in all, the largest 3.5TiB; 1 SSD, 1 NVMe\n",
		"gpus    2 (2 NVIDIA)\n",
		"nics    2, the fastest link up 25000 Mbit/s\n",
		"boot    uefi\n",
		"system  Dell Inc. PowerEdge XE8640\n",
		"nvme0n1  3.5TiB   nvme       PM1733  S1",
		"sdb      29.8GiB  usb",
		"removable\n",
		"eno1  b8:ce:f6:00:00:01  up    25000   mlx5_core  22.36\n",
		"eno2  b8:ce:f6:00:00:02  down  0 ",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the inventory lacks %q:\n%s", want, out.String())
		}
	}
	if err := printInventory(&out, &bcdv1.NodeInventoryResponse{Name: "x", Inventory: "{"}); err == nil {
		t.Error("an inventory that is not JSON printed")
	}
	out.Reset()
	if err := printInventory(&out, &bcdv1.NodeInventoryResponse{Name: "bare", Inventory: "{}", Facts: &bcdv1.HardwareFacts{}}); err != nil || !strings.Contains(out.String(), "cpu     (not reported): 0 sockets") || strings.Contains(out.String(), "DISK") {
		t.Errorf("an empty inventory: %v\n%s", err, out.String())
	}
}

// A pool's hardware requirements reach the server, which checks them and keeps them in the
// policy.
func TestPoolRequire(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	if code, _, errs := run(t, env, "pool", "update", "default", "--require", "ram>=1GiB"); code == 0 || !strings.Contains(errs, "policy.hardware_requirements") || !strings.Contains(errs, `unknown key "ram"`) {
		t.Fatalf("a pool requiring ram: %d %q", code, errs)
	}
	if code, _, errs := run(t, env, "pool", "update", "default", "--require", "memory>=256GiB", "--require", "gpus.nvidia>=2"); code != 0 {
		t.Fatalf("pool update --require: %d %q", code, errs)
	}
	if code, out, errs := run(t, env, "pool", "list"); code != 0 || !strings.Contains(out, "REQUIRES") || !strings.Contains(out, "memory>=256GiB gpus.nvidia>=2") {
		t.Fatalf("pool list: %d %s %q", code, out, errs)
	}
	code, out, errs := run(t, env, "pool", "list", "-o", "json")
	var list struct {
		Pools []struct {
			Name   string
			Policy struct{ HardwareRequirements []string }
		}
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Pools) != 1 ||
		!slices.Equal(list.Pools[0].Policy.HardwareRequirements, []string{"memory>=256GiB", "gpus.nvidia>=2"}) {
		t.Fatalf("pool list: %d %s %q", code, out, errs)
	}
}

// node list --hardware's columns: a node's threads, memory, disks and GPUs, dashes without an
// inventory.
func TestHardwareColumns(t *testing.T) {
	for _, c := range []struct {
		f    *bcdv1.HardwareFacts
		want string
	}{
		{nil, "\t-\t-\t-\t-"},
		{&bcdv1.HardwareFacts{Threads: 128, MemoryBytes: 512 << 30, Disks: 2, DiskBytes: 7680e9, Gpus: 8}, "\t128\t512GiB\t2 (7.0TiB)\t8"},
		{&bcdv1.HardwareFacts{}, "\t0\t0B\t0 (0B)\t0"},
	} {
		if got := hardwareColumns(c.f); got != c.want {
			t.Errorf("hardwareColumns(%v) = %q, want %q", c.f, got, c.want)
		}
	}
}
