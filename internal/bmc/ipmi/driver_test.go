package ipmi

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bougou/go-ipmi/pkg/types"

	"bcd/internal/bmc"
	"bcd/internal/lab/vbmc/ipmibmc"
)

func TestPowerActionsAgainstVirtualBMC(t *testing.T) {
	cases := []struct {
		action bmc.PowerAction
		on     bool
		want   counts // machine calls after the action settled
	}{
		{bmc.ActionOn, false, counts{on: true, ons: 1}},
		{bmc.ActionOn, true, counts{on: true}},
		{bmc.ActionOff, true, counts{on: false, offs: 1}},
		{bmc.ActionOff, false, counts{on: false}},
		{bmc.ActionSoft, true, counts{on: false, shutdowns: 1}},
		{bmc.ActionSoft, false, counts{on: false}},
		{bmc.ActionCycle, true, counts{on: true, offs: 1, ons: 1}},
		{bmc.ActionCycle, false, counts{on: true, ons: 1}},
		{bmc.ActionReset, true, counts{on: true, resets: 1}},
		{bmc.ActionReset, false, counts{on: true, ons: 1}},
	}
	for _, tc := range cases {
		t.Run(string(tc.action)+"/from-"+string(stateOf(tc.on)), func(t *testing.T) {
			m := &fakeMachine{on: tc.on}
			b := startBMC(t, ipmibmc.Config{}, m)
			d := newDriver(t, b, testPassword, quickOptions())
			ctx := t.Context()
			if err := d.SetPower(ctx, tc.action); err != nil {
				t.Fatalf("SetPower(%s): %v", tc.action, err)
			}
			eventually(t, "machine calls", func() bool { return m.counts() == tc.want })
			got, err := d.GetPower(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got != stateOf(tc.want.on) {
				t.Errorf("GetPower = %s, want %s", got, stateOf(tc.want.on))
			}
			// Nothing further happens (no late duplicate action).
			if c := m.counts(); c != tc.want {
				t.Errorf("machine calls = %+v, want %+v", c, tc.want)
			}
		})
	}
}

func TestSetPowerRejectsUnknownAction(t *testing.T) {
	d, err := New(bmc.Endpoint{Address: "127.0.0.1:1", Username: testUser, Password: testPassword}, quickOptions())
	if err != nil {
		t.Fatal(err)
	}
	err = d.SetPower(t.Context(), "explode")
	if err == nil || !strings.Contains(err.Error(), "unknown power action") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Fatalf("err = %v", err)
	}
}

func TestBootDeviceEveryCombination(t *testing.T) {
	m := &fakeMachine{}
	b := startBMC(t, ipmibmc.Config{}, m)
	d := newDriver(t, b, testPassword, quickOptions())
	ctx := t.Context()
	for _, dev := range []bmc.BootDevice{bmc.BootPXE, bmc.BootDisk, bmc.BootCD} {
		for _, persistent := range []bool{false, true} {
			for _, mode := range []bmc.BootMode{bmc.BootModeUEFI, bmc.BootModeLegacy, bmc.BootModeUnchanged} {
				opts := bmc.BootOptions{Persistent: persistent, Mode: mode}
				if err := d.SetBootDevice(ctx, dev, opts); err != nil {
					t.Fatalf("SetBootDevice(%s, %+v): %v", dev, opts, err)
				}
				if got := m.device(); got != string(dev) {
					t.Errorf("SetBootDevice(%s, %+v): machine boots %q", dev, opts, got)
				}
			}
		}
	}
}

func TestBootModeUnchangedKeepsTheBIOSBootType(t *testing.T) {
	m := &fakeMachine{}
	b := startBMC(t, ipmibmc.Config{}, m)
	d := newDriver(t, b, testPassword, quickOptions())
	ctx := t.Context()
	for _, mode := range []bmc.BootMode{bmc.BootModeUEFI, bmc.BootModeLegacy} {
		if err := d.SetBootDevice(ctx, bmc.BootDisk, bmc.BootOptions{Mode: mode}); err != nil {
			t.Fatal(err)
		}
		if err := d.SetBootDevice(ctx, bmc.BootPXE, bmc.BootOptions{Persistent: true}); err != nil {
			t.Fatal(err)
		}
		var got string
		err := d.withSession(ctx, "reading", func(ctx context.Context, s *session) error {
			f, err := s.readBootFlagsValue(ctx)
			got = describeBootFlags(f)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := "pxe, persistent, " + string(mode); got != want {
			t.Errorf("after %s then unchanged: flags %q, want %q", mode, got, want)
		}
	}
}

// TestBootModeUnchangedWithoutValidFlagsWritesUEFI: the workflows pass no mode. The boot type of
// flags that are not valid (a fresh BMC, a one-time override the BIOS used) is left-over noise and
// must not turn a UEFI machine into a legacy boot; a valid override's mode is kept, an explicit
// mode always wins.
func TestBootModeUnchangedWithoutValidFlagsWritesUEFI(t *testing.T) {
	legacyUsed := &types.BootOptionParam_BootFlags{BootFlagsValid: false, BootDeviceSelector: types.BootDeviceSelectorForceHardDrive}
	legacyValid := &types.BootOptionParam_BootFlags{BootFlagsValid: true, Persist: true, BootDeviceSelector: types.BootDeviceSelectorForceHardDrive}
	tests := []struct {
		name  string
		prior *types.BootOptionParam_BootFlags // written before; nil: fresh BMC
		mode  bmc.BootMode
		want  string
	}{
		{"fresh BMC, no mode", nil, bmc.BootModeUnchanged, "pxe, next boot only, uefi"},
		{"used legacy one-time override, no mode", legacyUsed, bmc.BootModeUnchanged, "pxe, next boot only, uefi"},
		{"valid legacy override, no mode", legacyValid, bmc.BootModeUnchanged, "pxe, next boot only, legacy"},
		{"fresh BMC, mode legacy", nil, bmc.BootModeLegacy, "pxe, next boot only, legacy"},
		{"used legacy one-time override, mode uefi", legacyUsed, bmc.BootModeUEFI, "pxe, next boot only, uefi"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := startBMC(t, ipmibmc.Config{}, &fakeMachine{})
			d := newDriver(t, b, testPassword, quickOptions())
			ctx := t.Context()
			if tt.prior != nil {
				err := d.withSession(ctx, "writing prior flags", func(ctx context.Context, s *session) error {
					return s.c.SetSystemBootOptionsParamFor(ctx, tt.prior)
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := d.SetBootDevice(ctx, bmc.BootPXE, bmc.BootOptions{Mode: tt.mode}); err != nil {
				t.Fatal(err)
			}
			var got string
			err := d.withSession(ctx, "reading", func(ctx context.Context, s *session) error {
				f, err := s.readBootFlagsValue(ctx)
				got = describeBootFlags(f)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("flags written %q, want %q", got, tt.want)
			}
		})
	}
}

func TestBootReadBackMismatchIsAnError(t *testing.T) {
	m := &fakeMachine{}
	b := startBMC(t, ipmibmc.Config{}, m)
	d := newDriver(t, b, testPassword, quickOptions())
	ctx := t.Context()
	if err := d.SetBootDevice(ctx, bmc.BootDisk, bmc.BootOptions{Persistent: true, Mode: bmc.BootModeLegacy}); err != nil {
		t.Fatal(err)
	}
	b.IgnoreBootWrites(true)
	err := d.SetBootDevice(ctx, bmc.BootPXE, bmc.BootOptions{Mode: bmc.BootModeUEFI})
	if err == nil {
		t.Fatal("SetBootDevice succeeded on a BMC that ignores boot writes")
	}
	for _, want := range []string{b.Addr().String(), "pxe, next boot only, uefi", "disk, persistent, legacy", "device", "not applied"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if got := m.device(); got != "disk" {
		t.Errorf("machine device changed to %q", got)
	}
	b.IgnoreBootWrites(false)
	if err := d.SetBootDevice(ctx, bmc.BootPXE, bmc.BootOptions{Mode: bmc.BootModeUEFI}); err != nil {
		t.Fatalf("after the hook is off: %v", err)
	}
}

func TestCipherSuites(t *testing.T) {
	cases := []struct {
		name      string
		bmc       []uint8
		driver    []uint8
		wantSuite uint8 // 0: connection must fail
	}{
		{"both offered, 17 preferred", []uint8{3, 17}, nil, 17},
		{"only 17 offered", []uint8{17}, nil, 17},
		{"only 3 offered: fallback", []uint8{3}, nil, 3},
		{"driver asks 3 first", []uint8{3, 17}, []uint8{3, 17}, 3},
		{"driver only 3, BMC only 17", []uint8{17}, []uint8{3}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := &fakeMachine{on: true}
			b := startBMC(t, ipmibmc.Config{CipherSuites: tc.bmc}, m)
			opts := quickOptions()
			opts.CipherSuites = tc.driver
			d := newDriver(t, b, testPassword, opts)
			var used uint8
			err := d.withSession(t.Context(), "probing", func(ctx context.Context, s *session) error {
				used = uint8(s.suite)
				_, err := s.poweredOn(ctx)
				return err
			})
			if tc.wantSuite == 0 {
				if err == nil || !strings.Contains(err.Error(), "no cipher suite worked") {
					t.Fatalf("err = %v, want no cipher suite worked", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if used != tc.wantSuite {
				t.Errorf("cipher suite %d, want %d", used, tc.wantSuite)
			}
		})
	}
}

func TestWrongCredentialsAreRefusedClearly(t *testing.T) {
	m := &fakeMachine{}
	b := startBMC(t, ipmibmc.Config{}, m)
	for _, tc := range []struct{ name, user, password string }{
		{"wrong password", testUser, "not-the-password"},
		{"unknown user", "nobody", testPassword},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(bmc.Endpoint{Address: b.Addr().String(), Username: tc.user, Password: tc.password}, quickOptions())
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = d.GetPower(t.Context())
			if !errors.Is(err, ErrAuth) {
				t.Fatalf("err = %v, want ErrAuth", err)
			}
			for _, want := range []string{"getting power state", b.Addr().String(), "wrong username or password"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			if strings.Contains(err.Error(), tc.password) {
				t.Errorf("error contains the password: %q", err)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("refusal took %s: should not retry other cipher suites", took)
			}
		})
	}
}

func TestInspect(t *testing.T) {
	m := &fakeMachine{on: true}
	b := startBMC(t, ipmibmc.Config{GUID: "8F1C6A2E-3B4D-4E5F-9A0B-1C2D3E4F5A6B"}, m)
	d := newDriver(t, b, testPassword, quickOptions())
	inv, err := d.Inspect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	want := bmc.OOBInventory{SystemUUID: "8f1c6a2e-3b4d-4e5f-9a0b-1c2d3e4f5a6b", Power: bmc.PowerOn}
	if inv.SystemUUID != want.SystemUUID || inv.Power != want.Power {
		t.Errorf("Inspect = %+v, want %+v", inv, want)
	}
}

func TestRotateCredential(t *testing.T) {
	const newPassword = "N3w-Secret-Value-12" // 19 bytes: the 20-byte form
	m := &fakeMachine{}
	b := startBMC(t, ipmibmc.Config{}, m)
	d := newDriver(t, b, testPassword, quickOptions())
	ctx := t.Context()
	if err := d.RotateCredential(ctx, newPassword); err != nil {
		t.Fatal(err)
	}
	if _, err := d.GetPower(ctx); err != nil {
		t.Fatalf("driver after rotation: %v", err)
	}
	if _, err := newDriver(t, b, testPassword, quickOptions()).GetPower(ctx); !errors.Is(err, ErrAuth) {
		t.Fatalf("old password: err = %v, want ErrAuth", err)
	}
	if _, err := newDriver(t, b, newPassword, quickOptions()).GetPower(ctx); err != nil {
		t.Fatalf("new password: %v", err)
	}
	// Back to a short (16-byte form) password.
	if err := d.RotateCredential(ctx, "short-pw"); err != nil {
		t.Fatal(err)
	}
	if _, err := newDriver(t, b, "short-pw", quickOptions()).GetPower(ctx); err != nil {
		t.Fatalf("short password: %v", err)
	}
	for _, bad := range []string{"", strings.Repeat("x", 21), "nul\x00byte"} {
		if err := d.RotateCredential(ctx, bad); err == nil {
			t.Errorf("RotateCredential accepted an invalid password of %d bytes", len(bad))
		}
	}
}

func TestRotateCredentialDetectsAnIgnoredChange(t *testing.T) {
	m := &fakeMachine{}
	b := startBMC(t, ipmibmc.Config{}, m)
	b.IgnorePasswordWrites(true)
	d := newDriver(t, b, testPassword, quickOptions())
	err := d.RotateCredential(t.Context(), "another-pw")
	if err == nil || !strings.Contains(err.Error(), "still accepts only the old password") {
		t.Fatalf("err = %v", err)
	}
	if _, err := d.GetPower(t.Context()); err != nil {
		t.Fatalf("driver must keep the old password: %v", err)
	}
}

// Firmware reads the BMC's revision by Get Device ID, as ipmitool prints it (the emulator's is
// major 1, minor 00).
func TestFirmware(t *testing.T) {
	b := startBMC(t, ipmibmc.Config{}, &fakeMachine{})
	d := newDriver(t, b, testPassword, quickOptions())
	got, err := d.Firmware(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := []bmc.Firmware{{ID: "BMC", Name: "BMC", Version: "1.00"}}; !slices.Equal(got, want) {
		t.Errorf("Firmware = %+v, want %+v", got, want)
	}
}
