package inventory

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestFirmwarePackageForDriver(t *testing.T) {
	tests := []struct {
		driver string
		pkg    string
		known  bool
	}{
		{"bnx2", "firmware-bnx2", true},
		{"bnx2x", "firmware-bnx2x", true},
		{"tg3", "firmware-misc-nonfree", true},
		{"i915", "firmware-misc-nonfree", true},
		{"qla2xxx", "firmware-qlogic", true},
		{"amdgpu", "firmware-amd-graphics", true},
		{"radeon", "firmware-amd-graphics", true},
		{"iwlwifi", "firmware-iwlwifi", true},
		{"r8169", "firmware-realtek", true},
		{"mlx5_core", "", true},
		{"virtio-pci", "", true},
		{"virtio_pci", "", true}, // dash/underscore agnostic
		{"e1000e", "", true},
		{"unknown_driver", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.driver, func(t *testing.T) {
			pkg, known := FirmwarePackageForDriver(tt.driver)
			if pkg != tt.pkg || known != tt.known {
				t.Errorf("got (%q, %v), want (%q, %v)", pkg, known, tt.pkg, tt.known)
			}
		})
	}
}

func TestFirmwareTablesWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range FirmwareDriverTable() {
		if r.Driver == "" || seen[r.Driver] {
			t.Errorf("driver %q empty or duplicated", r.Driver)
		}
		seen[r.Driver] = true
		if r.Package != "" && !strings.HasPrefix(r.Package, "firmware-") {
			t.Errorf("driver %s: package %q is not a firmware-* package", r.Driver, r.Package)
		}
	}
	for _, r := range FirmwareModaliasTable() {
		if !strings.HasPrefix(r.Pattern, "pci:v") || !strings.HasPrefix(r.Package, "firmware-") {
			t.Errorf("bad modalias rule %+v", r)
		}
	}
}

func TestFirmwarePackageForModalias(t *testing.T) {
	tests := []struct {
		modalias, pkg string
	}{
		{"pci:v000010ECd00008168sv00001462sd00007C02bc02sc00i00", "firmware-realtek"},
		{"pci:v000010ECd00005229sv00001028sd00000000bcFFsc00i00", ""}, // Realtek card reader: not a NIC
		{"pci:v00001002d000067DFsv00001002sd00000B31bc03sc00i00", "firmware-amd-graphics"},
		{"pci:v00001077d00002261sv00001077sd00000299bc0Csc04i00", "firmware-qlogic"},
		{"pci:v000010DEd000020B0sv000010DEsd00001450bc03sc02i00", ""},
		{"virtio:d00000001v00001AF4", ""},
		{"", ""},
	}
	for _, tt := range tests {
		if pkg, _ := FirmwarePackageForModalias(tt.modalias); pkg != tt.pkg {
			t.Errorf("%q: got %q, want %q", tt.modalias, pkg, tt.pkg)
		}
	}
}

func TestFirmwareHints(t *testing.T) {
	inv := Inventory{
		NICs: []NIC{
			{Name: "eno1", Driver: "bnx2", PCIAddress: "0000:01:00.0"},
			{Name: "eno2", Driver: "bnx2", PCIAddress: "0000:01:00.1"},
			{Name: "enp5s0", Driver: "mlx5_core", PCIAddress: "0000:05:00.0"},
			{Name: "wlp3s0", Driver: "iwlwifi", PCIAddress: "0000:03:00.0"},
		},
		PCI: []PCIDevice{
			{Address: "0000:01:00.0", Driver: "bnx2"}, // same function as eno1: not hinted twice
			{Address: "0000:00:02.0", Driver: "i915", Class: "030000"},
			{Address: "0000:04:00.0", Modalias: "pci:v00001002d000067DFsv00001002sd00000B31bc03sc00i00"},
			{Address: "0000:06:00.0", Driver: "mystery", Modalias: "pci:v000010ECd00008168sv0sd0bc02sc00i00"},
		},
	}
	want := []FirmwareHint{
		{Device: "0000:04:00.0", Package: "firmware-amd-graphics", Reason: "modalias pci:v00001002*bc03*"},
		{Device: "eno1", Driver: "bnx2", Package: "firmware-bnx2", Reason: "driver bnx2"},
		{Device: "eno2", Driver: "bnx2", Package: "firmware-bnx2", Reason: "driver bnx2"},
		{Device: "wlp3s0", Driver: "iwlwifi", Package: "firmware-iwlwifi", Reason: "driver iwlwifi"},
		{Device: "0000:00:02.0", Driver: "i915", Package: "firmware-misc-nonfree", Reason: "driver i915"},
		{Device: "0000:06:00.0", Driver: "mystery", Package: "firmware-realtek", Reason: "modalias pci:v000010EC*bc02*"},
	}
	got := FirmwareHints(inv)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("hints =\n%+v\nwant\n%+v", got, want)
	}
	pkgs := FirmwarePackages(got)
	if !slices.Equal(pkgs, []string{"firmware-amd-graphics", "firmware-bnx2", "firmware-iwlwifi", "firmware-misc-nonfree", "firmware-realtek"}) {
		t.Errorf("packages = %v", pkgs)
	}
	if len(FirmwareHints(Inventory{})) != 0 {
		t.Error("empty inventory: want no hints")
	}
}
