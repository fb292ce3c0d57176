package ipmi

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"bcd/internal/bmc"
	"bcd/internal/lab/vbmc/ipmibmc"
)

// TestPasswordsNeverLeak runs every operation, successful and failing, with debug logs from the
// driver and the virtual BMC captured, and greps logs, errors and String() output for every
// password involved.
func TestPasswordsNeverLeak(t *testing.T) {
	const (
		wrongPassword = "Wr0ng-Passw0rd-xyz"
		newPassword   = "Rotated-Secret-9911"
	)
	var logs syncBuffer
	jsonLog := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	textLog := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m := &fakeMachine{on: true}
	b := startBMC(t, ipmibmc.Config{Logger: jsonLog}, m)
	opts := quickOptions()
	opts.Logger = textLog
	d := newDriver(t, b, testPassword, opts)
	bad := newDriver(t, b, wrongPassword, opts)
	ctx := t.Context()

	var errs []error
	collect := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	_, err := d.GetPower(ctx)
	collect(err)
	collect(d.SetPower(ctx, bmc.ActionOff))
	collect(d.SetPower(ctx, bmc.ActionCycle))
	collect(d.SetBootDevice(ctx, bmc.BootPXE, bmc.BootOptions{Mode: bmc.BootModeUEFI}))
	_, err = d.Inspect(ctx)
	collect(err)
	if len(errs) != 0 {
		t.Fatalf("successful operations failed: %v", errs)
	}
	b.IgnoreBootWrites(true)
	collect(d.SetBootDevice(ctx, bmc.BootDisk, bmc.BootOptions{}))
	b.IgnoreBootWrites(false)
	_, err = bad.GetPower(ctx)
	collect(err)
	collect(bad.SetPower(ctx, bmc.ActionOn))
	collect(bad.RotateCredential(ctx, newPassword))
	b.IgnorePasswordWrites(true)
	collect(d.RotateCredential(ctx, newPassword))
	b.IgnorePasswordWrites(false)
	collect(d.RotateCredential(ctx, strings.Repeat(newPassword, 2))) // too long: refused locally
	if len(errs) != 6 {
		t.Fatalf("want 6 failures, got %d: %v", len(errs), errs)
	}
	if err := d.RotateCredential(ctx, newPassword); err != nil {
		t.Fatal(err)
	}
	_, err = newDriver(t, b, testPassword, opts).GetPower(ctx) // old one now refused
	collect(err)

	textLog.Info("driver as a value", "driver", d, "endpoint", bmc.Endpoint{Address: "x", Username: testUser, Password: testPassword})
	jsonLog.Info("driver as a value", "driver", d)

	var out strings.Builder
	out.WriteString(logs.String())
	for _, e := range errs {
		out.WriteString(e.Error() + "\n")
		fmt.Fprintf(&out, "%+v %#v\n", e, e)
	}
	fmt.Fprintf(&out, "%s %v %+v %#v %s\n", d, d, d, d, b)
	all := out.String()
	if !strings.Contains(all, "wrong username or password") || !strings.Contains(all, "power action") {
		t.Fatalf("capture looks empty:\n%s", all)
	}
	for _, secret := range []string{testPassword, wrongPassword, newPassword} {
		if strings.Contains(all, secret) {
			t.Errorf("password %q leaked:\n%s", secret, all)
		}
	}
}
