package ipmi

import (
	"fmt"
	"strings"
	"testing"

	"github.com/bougou/go-ipmi/pkg/command/chassis"
	"github.com/bougou/go-ipmi/pkg/types"

	"bcd/internal/bmc"
)

// TestPlanPowerExhaustive walks every (action, state) pair.
func TestPlanPowerExhaustive(t *testing.T) {
	up := powerStep{Send: true, Control: chassis.ChassisControlPowerUp, Await: bmc.PowerOn}
	want := map[bmc.PowerAction][2]powerStep{ // [off, on]
		bmc.ActionOn:    {up, {}},
		bmc.ActionOff:   {{}, {Send: true, Control: chassis.ChassisControlPowerDown, Await: bmc.PowerOff}},
		bmc.ActionSoft:  {{}, {Send: true, Control: chassis.ChassisControlSoftShutdown}},
		bmc.ActionCycle: {up, {Send: true, Control: chassis.ChassisControlPowerCycle}},
		bmc.ActionReset: {up, {Send: true, Control: chassis.ChassisControlHardReset}},
	}
	if len(want) != len(bmc.PowerActions) {
		t.Fatalf("table covers %d actions, bmc has %d", len(want), len(bmc.PowerActions))
	}
	for _, a := range bmc.PowerActions {
		for i, on := range []bool{false, true} {
			got, err := planPower(a, on)
			if err != nil {
				t.Fatalf("planPower(%s, %v): %v", a, on, err)
			}
			if got != want[a][i] {
				t.Errorf("planPower(%s, on=%v) = %+v, want %+v", a, on, got, want[a][i])
			}
			if got.Send && controlNames[got.Control] == "" {
				t.Errorf("no name for control %d", got.Control)
			}
		}
	}
	if _, err := planPower("bounce", true); err == nil {
		t.Error("planPower accepted an unknown action")
	}
}

func TestPlanBootFlagsExhaustive(t *testing.T) {
	sel := map[bmc.BootDevice]types.BootDeviceSelector{bmc.BootPXE: 0x1, bmc.BootDisk: 0x2, bmc.BootCD: 0x5}
	for dev, s := range sel {
		for _, persistent := range []bool{false, true} {
			for _, mode := range []bmc.BootMode{bmc.BootModeUEFI, bmc.BootModeLegacy, bmc.BootModeUnchanged} {
				for _, current := range []types.BootOptionParam_BootFlags{
					{BootFlagsValid: true, BIOSBootType: types.BIOSBootTypeLegacy},
					{BootFlagsValid: true, BIOSBootType: types.BIOSBootTypeEFI},
					{BootFlagsValid: false, BIOSBootType: types.BIOSBootTypeLegacy}, // fresh BMC or used one-time override
					{BootFlagsValid: false, BIOSBootType: types.BIOSBootTypeEFI},
				} {
					got, err := planBootFlags(dev, bmc.BootOptions{Persistent: persistent, Mode: mode}, current)
					if err != nil {
						t.Fatal(err)
					}
					// Unchanged keeps the boot type of a valid override only; otherwise EFI.
					unchanged := types.BIOSBootTypeEFI
					if current.BootFlagsValid {
						unchanged = current.BIOSBootType
					}
					wantEFI := map[bmc.BootMode]types.BIOSBootType{bmc.BootModeUEFI: true, bmc.BootModeLegacy: false, bmc.BootModeUnchanged: unchanged}[mode]
					want := types.BootOptionParam_BootFlags{BootFlagsValid: true, Persist: persistent, BootDeviceSelector: s, BIOSBootType: wantEFI}
					if got != want {
						t.Errorf("planBootFlags(%s, %v, %q, current %+v) = %+v, want %+v", dev, persistent, mode, current, got, want)
					}
					// The wire bytes match what ipmitool sends for the same request.
					b := got.Pack()
					if b[1]>>2&0x0f != uint8(s) || (b[0]&0x80 == 0) || (b[0]&0x40 != 0) != persistent || (b[0]&0x20 != 0) != bool(wantEFI) {
						t.Errorf("packed %x for %s/%v/%s", b, dev, persistent, mode)
					}
				}
			}
		}
	}
	if _, err := planBootFlags("floppy", bmc.BootOptions{}, types.BootOptionParam_BootFlags{}); err == nil {
		t.Error("unknown device accepted")
	}
	if _, err := planBootFlags(bmc.BootPXE, bmc.BootOptions{Mode: "bios"}, types.BootOptionParam_BootFlags{}); err == nil {
		t.Error("unknown mode accepted")
	}
}

func TestBootMismatch(t *testing.T) {
	want := types.BootOptionParam_BootFlags{BootFlagsValid: true, Persist: true, BIOSBootType: true, BootDeviceSelector: 1}
	cases := []struct {
		mutate func(*types.BootOptionParam_BootFlags)
		diff   string
	}{
		{func(*types.BootOptionParam_BootFlags) {}, ""},
		{func(f *types.BootOptionParam_BootFlags) { f.BootFlagsValid = false }, "valid bit"},
		{func(f *types.BootOptionParam_BootFlags) { f.BootDeviceSelector = 2 }, "device"},
		{func(f *types.BootOptionParam_BootFlags) { f.Persist = false }, "persistence"},
		{func(f *types.BootOptionParam_BootFlags) { f.BIOSBootType = false }, "boot mode"},
		{func(f *types.BootOptionParam_BootFlags) { *f = types.BootOptionParam_BootFlags{} }, "valid bit, device, persistence, boot mode"},
		// Fields we do not ask for are not compared.
		{func(f *types.BootOptionParam_BootFlags) { f.ScreenBlank = true; f.CMOSClear = true }, ""},
	}
	for i, tc := range cases {
		got := want
		tc.mutate(&got)
		if d := bootMismatch(want, got); d != tc.diff {
			t.Errorf("case %d: bootMismatch = %q, want %q", i, d, tc.diff)
		}
	}
	if got := describeBootFlags(want); got != "pxe, persistent, uefi" {
		t.Errorf("describe = %q", got)
	}
	if got := describeBootFlags(types.BootOptionParam_BootFlags{}); !strings.Contains(got, "no override") {
		t.Errorf("describe = %q", got)
	}
}

// TestFormatSMBIOSGUID checks our decoding against go-ipmi's independent SMBIOS decoder.
func TestFormatSMBIOSGUID(t *testing.T) {
	// DSP0134's example: {00112233-4455-6677-8899-AABBCCDDEEFF} is 33 22 11 00 55 44 77 66 88 99 AA BB CC DD EE FF.
	wire := [16]byte{0x33, 0x22, 0x11, 0x00, 0x55, 0x44, 0x77, 0x66, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}
	got, ok := formatSMBIOSGUID(wire)
	if !ok || got != "00112233-4455-6677-8899-aabbccddeeff" {
		t.Fatalf("formatSMBIOSGUID = %q, %v", got, ok)
	}
	for i := range 200 {
		var b [16]byte
		for j := range b {
			b[j] = byte(i*31 + j*17 + i*j)
		}
		u, err := types.ParseGUID(b[:], types.GUIDModeSMBIOS)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := formatSMBIOSGUID(b); ok && got != u.String() {
			t.Fatalf("%x: ours %s, go-ipmi %s", b, got, u)
		}
	}
	var zero, ff [16]byte
	for i := range ff {
		ff[i] = 0xff
	}
	for _, b := range [][16]byte{zero, ff} {
		if s, ok := formatSMBIOSGUID(b); ok || s != "" {
			t.Errorf("%x: got %q, %v; want absent", b, s, ok)
		}
	}
}

func TestSplitAddress(t *testing.T) {
	cases := []struct {
		in   string
		host string
		port int
		bad  bool
	}{
		{"10.0.0.5", "10.0.0.5", 623, false},
		{"10.0.0.5:6230", "10.0.0.5", 6230, false},
		{"bmc-7.rack3", "bmc-7.rack3", 623, false},
		{"bmc-7.rack3:624", "bmc-7.rack3", 624, false},
		{"::1", "::1", 623, false},
		{"[::1]", "::1", 623, false},
		{"[fd00::5]:6230", "fd00::5", 6230, false},
		{"", "", 0, true},
		{"host:0", "", 0, true},
		{"host:70000", "", 0, true},
		{"host:abc", "", 0, true},
		{":623", "", 0, true},
		{"a:b:c", "", 0, true},
		// User information, a path, a query or a fragment: refused (a credential may hide there).
		{"admin@10.0.0.5", "", 0, true},
		{"admin:pw@10.0.0.5:623", "", 0, true},
		{"10.0.0.5?password=pw", "", 0, true},
		{"10.0.0.5#pw", "", 0, true},
		{"10.0.0.5/pw", "", 0, true},
	}
	for _, tc := range cases {
		h, p, err := splitAddress(tc.in)
		if (err != nil) != tc.bad || (!tc.bad && (h != tc.host || p != tc.port)) {
			t.Errorf("splitAddress(%q) = %q, %d, %v", tc.in, h, p, err)
		}
	}
}

func TestNewValidates(t *testing.T) {
	ok := bmc.Endpoint{Address: "10.0.0.5", Username: "admin", Password: "pw"}
	cases := []struct {
		name string
		ep   bmc.Endpoint
		opts Options
	}{
		{"no user", bmc.Endpoint{Address: "h", Password: "pw"}, Options{}},
		{"long user", bmc.Endpoint{Address: "h", Username: strings.Repeat("u", 17), Password: "pw"}, Options{}},
		{"no password", bmc.Endpoint{Address: "h", Username: "u"}, Options{}},
		{"long password", bmc.Endpoint{Address: "h", Username: "u", Password: strings.Repeat("p", 21)}, Options{}},
		{"bad address", bmc.Endpoint{Address: "h:x", Username: "u", Password: "pw"}, Options{}},
		{"suite 0 (no auth)", ok, Options{CipherSuites: []uint8{0}}},
		{"suite 1 (no encryption)", ok, Options{CipherSuites: []uint8{17, 1}}},
	}
	for _, tc := range cases {
		if _, err := New(tc.ep, tc.opts); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	d, err := New(ok, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(d); got != "ipmi admin@10.0.0.5:623" {
		t.Errorf("String = %q", got)
	}
}

// An address with user information, a query or a fragment is refused, and the error (which the
// site agent reports and logs) does not quote it: the driver would otherwise dial, and log, a
// "host" holding the credential.
func TestNewNeverQuotesACredentialInTheAddress(t *testing.T) {
	for _, addr := range []string{"admin:addr-secret@10.0.0.5:623", "admin@10.0.0.5", "10.0.0.5?password=addr-secret", "10.0.0.5#addr-secret"} {
		_, err := New(bmc.Endpoint{Address: addr, Username: "admin", Password: "pw"}, Options{})
		if err == nil {
			t.Errorf("%s: accepted", addr)
			continue
		}
		if strings.Contains(err.Error(), "addr-secret") || strings.Contains(err.Error(), "admin@") {
			t.Errorf("%s: the error quotes it: %v", addr, err)
		}
	}
}

// The firmware revision reads as ipmitool prints it: major in binary (bit 7 is "device
// available", not the revision), minor as two BCD digits.
func TestFirmwareRevision(t *testing.T) {
	for _, c := range []struct {
		major, minor uint8
		want         string
	}{{1, 0x00, "1.00"}, {2, 0x05, "2.05"}, {3, 0x47, "3.47"}, {0x85, 0x10, "5.10"}, {127, 0x99, "127.99"}} {
		if got := FirmwareRevision(c.major, c.minor); got != c.want {
			t.Errorf("FirmwareRevision(%d, %#x) = %q, want %q", c.major, c.minor, got, c.want)
		}
	}
}
