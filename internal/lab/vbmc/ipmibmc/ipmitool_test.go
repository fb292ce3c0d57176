package ipmibmc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// ipmitoolPath finds ipmitool (Debian package "ipmitool"). Under CI=true its absence fails the
// test; elsewhere the test is skipped.
func ipmitoolPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("ipmitool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("ipmitool not found (CI=true): install it with apt-get install --no-install-recommends ipmitool")
		}
		t.Skip("ipmitool not installed (apt-get install --no-install-recommends ipmitool)")
	}
	return p
}

// ipmitool runs one ipmitool command against the BMC on loopback; the password goes through
// the environment (-E), not argv.
func ipmitool(t *testing.T, bin string, port int, password, suite string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	argv := append([]string{"-I", "lanplus", "-H", "127.0.0.1", "-p", fmt.Sprint(port), "-U", testUser, "-E", "-C", suite, "-N", "1", "-R", "2"}, args...)
	cmd := exec.CommandContext(ctx, bin, argv...)
	cmd.Env = append(os.Environ(), "IPMI_PASSWORD="+password)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestIpmitool(t *testing.T) {
	bin := ipmitoolPath(t)
	m := &fakeMachine{on: true}
	b := start(t, Config{}, m)
	port := b.Addr().Port
	run := func(suite string, args ...string) string {
		t.Helper()
		out, err := ipmitool(t, bin, port, testPassword, suite, args...)
		if err != nil {
			t.Fatalf("ipmitool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	expect := func(out string, wants ...string) {
		t.Helper()
		for _, w := range wants {
			if !strings.Contains(out, w) {
				t.Errorf("ipmitool output lacks %q:\n%s", w, out)
			}
		}
	}
	for _, suite := range []string{"17", "3"} {
		expect(run(suite, "chassis", "power", "status"), "Chassis Power is on")
	}

	run("17", "chassis", "power", "off")
	eventually(t, "off", func() bool { on, _ := m.PoweredOn(t.Context()); return !on })
	expect(run("17", "chassis", "power", "status"), "Chassis Power is off")
	run("17", "chassis", "power", "on")
	eventually(t, "on", func() bool { on, _ := m.PoweredOn(t.Context()); return on })
	run("17", "chassis", "power", "cycle")
	run("17", "chassis", "power", "reset")
	eventually(t, "cycle and reset", func() bool { return b.done.Load() == b.queued.Load() && b.queued.Load() == 4 })
	if got, want := m.counts(), (counts{ons: 2, offs: 2, resets: 1}); got != want {
		t.Errorf("machine calls %+v, want %+v", got, want)
	}
	run("17", "chassis", "power", "soft")
	eventually(t, "soft", func() bool { return m.counts().shutdowns == 1 })

	run("17", "chassis", "bootdev", "pxe")
	if m.device() != "pxe" {
		t.Errorf("machine device %q after bootdev pxe", m.device())
	}
	expect(run("17", "chassis", "bootparam", "get", "5"), "Boot Flag Valid", "Force PXE")
	run("17", "chassis", "bootdev", "disk", "options=persistent,efiboot")
	if m.device() != "disk" {
		t.Errorf("machine device %q after bootdev disk", m.device())
	}
	expect(run("17", "chassis", "bootparam", "get", "5"), "Force Boot from default Hard-Drive", "Options apply to all future boots", "BIOS EFI boot")
	run("3", "chassis", "bootdev", "cdrom")
	expect(run("3", "chassis", "bootparam", "get", "5"), "Force Boot from CD/DVD")

	// Debian's ipmitool 1.8.19 prints the wire bytes as they come: SMBIOS order, first three
	// fields little-endian (DSP0134 7.2.1).
	expect(run("17", "mc", "guid"), "33221100554477668899AABBCCDDEEFF")

	// Credential rotation through ipmitool, then the old password is refused.
	const newPassword = "ipmitool-new-pw"
	run("17", "user", "set", "password", "2", newPassword)
	if out, err := ipmitool(t, bin, port, newPassword, "17", "chassis", "power", "status"); err != nil {
		t.Fatalf("new password refused: %v\n%s", err, out)
	}
	if out, err := ipmitool(t, bin, port, testPassword, "17", "chassis", "power", "status"); err == nil {
		t.Fatalf("old password still accepted:\n%s", out)
	}
}
