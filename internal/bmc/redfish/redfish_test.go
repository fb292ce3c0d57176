package redfish_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/bmc"
	"bcd/internal/bmc/redfish"
	"bcd/internal/lab/vbmc"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
	"bcd/internal/testlog"
)

const (
	user = "admin"
	pass = "Very-S3cret-Passw0rd-4711"
)

// syncBuffer is a log sink safe for concurrent writers that the test reads.
type syncBuffer = testlog.Buffer

type rig struct {
	m    *vbmc.FakeMachine
	svc  *redfishbmc.Service
	srv  *httptest.Server
	c    *redfish.Client
	logs *syncBuffer
	errs []error
}

func fastOpts(logs *syncBuffer) redfish.Options {
	return redfish.Options{BackoffInitial: time.Millisecond, BackoffMax: 4 * time.Millisecond, MaxAttempts: 6,
		PollInterval: time.Millisecond, PowerOffWait: 2 * time.Second,
		Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
}

func newRig(t *testing.T, mod func(*redfishbmc.Config), opts func(*redfish.Options)) *rig {
	t.Helper()
	logs := &syncBuffer{}
	cfg := redfishbmc.Config{Username: user, Password: pass, UUID: "4C4C4544-0042-3510-8056-B4C04F4E3432",
		SerialNumber: "SN-1", Manufacturer: "QEMU", Model: "q35", MACs: []string{"52:54:00:AB:CD:EF", "52-54-00-00-00-02"},
		MediaDir: t.TempDir(), AllowFileImages: true,
		Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if mod != nil {
		mod(&cfg)
	}
	m := vbmc.NewFakeMachine()
	svc, err := redfishbmc.New(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	o := fastOpts(logs)
	if opts != nil {
		opts(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := redfish.New(ctx, bmc.Endpoint{Address: srv.URL, Username: user, Password: pass}, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := &rig{m: m, svc: svc, srv: srv, c: c, logs: logs}
	t.Cleanup(func() {
		_ = c.Close(context.Background())
		r.checkNoSecret(t, pass)
	})
	return r
}

func (r *rig) note(err error) error {
	if err != nil {
		r.errs = append(r.errs, err)
	}
	return err
}

// checkNoSecret fails if the password shows in any captured log line or error.
func (r *rig) checkNoSecret(t *testing.T, secret string) {
	t.Helper()
	if strings.Contains(r.logs.String(), secret) {
		t.Errorf("password in logs:\n%s", r.logs.String())
	}
	for _, err := range r.errs {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("password in error: %v", err)
		}
	}
	if strings.Contains(r.c.String(), secret) {
		t.Errorf("password in String(): %s", r.c.String())
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestPowerEachActionEachSubset(t *testing.T) {
	subsets := map[string][]string{
		"all":         nil,
		"no-cycle":    {"On", "ForceOff", "GracefulShutdown", "ForceRestart"},
		"no-graceful": {"On", "ForceOff", "ForceRestart", "PowerCycle"},
		"minimal":     {"On", "ForceOff"},
	}
	for name, subset := range subsets {
		for _, action := range bmc.PowerActions {
			for _, startOn := range []bool{false, true} {
				t.Run(name+"/"+string(action)+"/on="+map[bool]string{true: "1", false: "0"}[startOn], func(t *testing.T) {
					r := newRig(t, func(c *redfishbmc.Config) { c.Quirks.ResetTypes = subset }, nil)
					r.m.SetOn(startOn)
					allowed := subset
					if allowed == nil {
						allowed = redfishbmc.AllResetTypes()
					}
					plan, planErr := redfish.PlanPower(action, allowed, map[bool]bmc.PowerState{true: bmc.PowerOn, false: bmc.PowerOff}[startOn])
					err := r.note(r.c.SetPower(ctx(t), action))
					if planErr != nil {
						if err == nil {
							t.Fatalf("SetPower succeeded, plan said %v", planErr)
						}
						if r.svc.Count(redfishbmc.KindReset) != 0 {
							t.Fatal("a refused action still sent a reset")
						}
						return
					}
					if err != nil {
						t.Fatalf("SetPower: %v", err)
					}
					sent := 0
					for _, s := range plan {
						if s != redfish.StepWaitOff {
							sent++
						}
					}
					if got := r.svc.Count(redfishbmc.KindReset); got != sent {
						t.Fatalf("resets sent %d, plan %v", got, plan)
					}
					wantOn := action != bmc.ActionOff && action != bmc.ActionSoft
					if r.m.State().On != wantOn {
						t.Fatalf("machine on = %v, want %v (plan %v)", r.m.State().On, wantOn, plan)
					}
					p, err := r.c.GetPower(ctx(t))
					if err != nil || (p == bmc.PowerOn) != wantOn {
						t.Fatalf("GetPower = %s, %v", p, err)
					}
				})
			}
		}
	}
}

func TestPlanPower(t *testing.T) {
	all := redfishbmc.AllResetTypes()
	on, off, unknown := bmc.PowerOn, bmc.PowerOff, bmc.PowerUnknown
	tests := []struct {
		action  bmc.PowerAction
		allowed []string
		state   bmc.PowerState
		want    []string
		wantErr bool
	}{
		{bmc.ActionOn, all, on, nil, false},
		{bmc.ActionOn, all, off, []string{"On"}, false},
		{bmc.ActionOn, []string{"ForceOn", "ForceOff"}, off, []string{"ForceOn"}, false},
		{bmc.ActionOn, []string{"ForceOff"}, off, nil, true},
		{bmc.ActionOff, all, on, []string{"ForceOff"}, false},
		{bmc.ActionOff, all, off, nil, false},
		{bmc.ActionOff, []string{"On"}, on, nil, true},
		{bmc.ActionSoft, all, on, []string{"GracefulShutdown"}, false},
		{bmc.ActionSoft, []string{"On", "ForceOff"}, on, nil, true},
		{bmc.ActionSoft, all, off, nil, false},
		{bmc.ActionCycle, all, on, []string{"PowerCycle"}, false},
		{bmc.ActionCycle, []string{"On", "ForceOff"}, on, []string{"ForceOff", redfish.StepWaitOff, "On"}, false},
		{bmc.ActionCycle, []string{"On"}, on, nil, true},
		{bmc.ActionCycle, all, off, []string{"On"}, false},
		{bmc.ActionReset, all, on, []string{"ForceRestart"}, false},
		{bmc.ActionReset, []string{"On", "ForceOff", "PowerCycle"}, on, []string{"PowerCycle"}, false},
		{bmc.ActionReset, []string{"On", "ForceOff"}, on, []string{"ForceOff", redfish.StepWaitOff, "On"}, false},
		{bmc.ActionReset, all, off, []string{"On"}, false},
		{bmc.ActionOn, nil, off, []string{"On"}, false},
		// Unknown state (no or an unrecognized PowerState): nothing is skipped, cycle and reset take the cycle path.
		{bmc.ActionOn, all, unknown, []string{"On"}, false},
		{bmc.ActionOff, all, unknown, []string{"ForceOff"}, false},
		{bmc.ActionSoft, all, unknown, []string{"GracefulShutdown"}, false},
		{bmc.ActionCycle, all, unknown, []string{"PowerCycle"}, false},
		{bmc.ActionReset, all, unknown, []string{"PowerCycle"}, false},
		{bmc.ActionCycle, []string{"On", "ForceOff", "ForceRestart"}, unknown, []string{"ForceOff", redfish.StepWaitOff, "On"}, false},
		{bmc.ActionReset, []string{"On", "ForceOff", "ForceRestart"}, unknown, []string{"ForceOff", redfish.StepWaitOff, "On"}, false},
		{bmc.ActionReset, []string{"ForceOn", "ForceOff"}, unknown, []string{"ForceOff", redfish.StepWaitOff, "ForceOn"}, false},
		{bmc.ActionOff, []string{"On"}, unknown, nil, true},
		{"explode", all, on, nil, true},
	}
	for _, tt := range tests {
		got, err := redfish.PlanPower(tt.action, tt.allowed, tt.state)
		if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
			t.Errorf("PlanPower(%s, %v, %s) = %v, %v; want %v (err %v)", tt.action, tt.allowed, tt.state, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestBootDeviceBothLayouts(t *testing.T) {
	for _, layout := range []redfishbmc.Layout{redfishbmc.LayoutPlain, redfishbmc.LayoutSettings} {
		for _, dev := range []bmc.BootDevice{bmc.BootPXE, bmc.BootDisk, bmc.BootCD} {
			for _, opts := range []bmc.BootOptions{{}, {Persistent: true, Mode: bmc.BootModeUEFI}, {Mode: bmc.BootModeLegacy}} {
				t.Run(string(layout)+"/"+string(dev), func(t *testing.T) {
					r := newRig(t, func(c *redfishbmc.Config) { c.Layout = layout }, nil)
					if err := r.note(r.c.SetBootDevice(ctx(t), dev, opts)); err != nil {
						t.Fatalf("SetBootDevice(%s, %+v): %v", dev, opts, err)
					}
					want := map[bmc.BootDevice]string{bmc.BootPXE: "pxe", bmc.BootDisk: "disk", bmc.BootCD: "cd"}[dev]
					if r.m.State().Boot != want {
						t.Fatalf("machine boots %s, want %s", r.m.State().Boot, want)
					}
				})
			}
		}
	}
}

func TestBootOverrideIgnoredIsDetected(t *testing.T) {
	for _, layout := range []redfishbmc.Layout{redfishbmc.LayoutPlain, redfishbmc.LayoutSettings} {
		r := newRig(t, func(c *redfishbmc.Config) { c.Layout = layout; c.Quirks.IgnoreBootOverride = true }, nil)
		err := r.note(r.c.SetBootDevice(ctx(t), bmc.BootDisk, bmc.BootOptions{}))
		if err == nil {
			t.Fatalf("%s: ignored override not detected", layout)
		}
		for _, want := range []string{"did not apply", `BootSourceOverrideTarget="None"`, `wanted "Hdd"`, r.srv.URL} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %q lacks %q", layout, err, want)
			}
		}
	}
}

func TestRetriesOnBusy(t *testing.T) {
	tests := []struct {
		name string
		busy []redfishbmc.Busy
		kind string
		run  func(*rig, context.Context, string) error
	}{
		{"reset 503 NodeBusy", []redfishbmc.Busy{{Kind: redfishbmc.KindReset, Count: 2, Status: 503, MessageID: "Base.1.15.NodeBusy"}},
			redfishbmc.KindReset, func(r *rig, c context.Context, _ string) error { return r.c.SetPower(c, bmc.ActionOn) }},
		{"reset 409 ResetInProgress", []redfishbmc.Busy{{Kind: redfishbmc.KindReset, Count: 1, Status: 409, MessageID: "Base.1.15.ResetInProgress"}},
			redfishbmc.KindReset, func(r *rig, c context.Context, _ string) error { return r.c.SetPower(c, bmc.ActionOn) }},
		{"boot 400 UnableToModifyDuringSystemPOST", []redfishbmc.Busy{{Kind: redfishbmc.KindBoot, Count: 2, Status: 400, MessageID: "IDRAC.2.8.UnableToModifyDuringSystemPOST"}},
			redfishbmc.KindBoot, func(r *rig, c context.Context, _ string) error {
				return r.c.SetBootDevice(c, bmc.BootPXE, bmc.BootOptions{})
			}},
		{"boot 412", []redfishbmc.Busy{{Kind: redfishbmc.KindBoot, Count: 1, Status: 412, MessageID: "Base.1.15.PreconditionFailed"}},
			redfishbmc.KindBoot, func(r *rig, c context.Context, _ string) error {
				return r.c.SetBootDevice(c, bmc.BootCD, bmc.BootOptions{})
			}},
		{"media ResourceInUse", []redfishbmc.Busy{{Kind: redfishbmc.KindMedia, Count: 1, Status: 409, MessageID: "Base.1.15.ResourceInUse"}},
			redfishbmc.KindMedia, func(r *rig, c context.Context, dir string) error {
				f := filepath.Join(dir, "test.iso")
				_ = os.WriteFile(f, []byte("iso"), 0o600)
				return r.c.InsertMedia(c, "file://"+f)
			}},
		{"reads 503", []redfishbmc.Busy{{Kind: redfishbmc.KindRead, Count: 3, Status: 503, MessageID: "Base.1.15.ServiceTemporarilyUnavailable"}},
			redfishbmc.KindRead, func(r *rig, c context.Context, _ string) error { _, err := r.c.GetPower(c); return err }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r2 := newRig(t, func(c *redfishbmc.Config) { c.Quirks.Busy = tt.busy }, nil)
			before := r2.svc.Count(tt.kind)
			if err := r2.note(tt.run(r2, ctx(t), t.TempDir())); err != nil {
				t.Fatalf("operation failed despite retries: %v", err)
			}
			refused := 0
			for _, b := range tt.busy {
				refused += b.Count
			}
			if got := r2.svc.Count(tt.kind) - before; got < refused+1 {
				t.Fatalf("%s requests: %d, want at least %d (retries)", tt.kind, got, refused+1)
			}
		})
	}
}

func TestNonTransientFailsFastWithBMCMessage(t *testing.T) {
	r := newRig(t, func(c *redfishbmc.Config) {
		c.Quirks.Busy = []redfishbmc.Busy{{Kind: redfishbmc.KindReset, Count: 5, Status: 400, MessageID: "Base.1.15.ActionNotSupported"}}
	}, nil)
	err := r.note(r.c.SetPower(ctx(t), bmc.ActionOn))
	if err == nil {
		t.Fatal("SetPower succeeded")
	}
	if r.svc.Count(redfishbmc.KindReset) != 1 {
		t.Fatalf("a permanent error was retried: %d resets", r.svc.Count(redfishbmc.KindReset))
	}
	for _, want := range []string{"power on", r.srv.URL, "ActionNotSupported", "HTTP 400"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	var re *redfish.Error
	if !errors.As(err, &re) || re.BMC != r.srv.URL {
		t.Fatalf("not a *redfish.Error: %T", err)
	}
}

func TestRetryGivesUp(t *testing.T) {
	r := newRig(t, func(c *redfishbmc.Config) {
		c.Quirks.Busy = []redfishbmc.Busy{{Kind: redfishbmc.KindReset, Count: 100, Status: 503, MessageID: "Base.1.15.NodeBusy"}}
	}, nil)
	err := r.note(r.c.SetPower(ctx(t), bmc.ActionOn))
	if err == nil || !strings.Contains(err.Error(), "NodeBusy") {
		t.Fatalf("err = %v", err)
	}
	if n := r.svc.Count(redfishbmc.KindReset); n != 6 {
		t.Fatalf("%d attempts, want MaxAttempts=6", n)
	}
}

func TestInspect(t *testing.T) {
	r := newRig(t, nil, nil)
	r.m.SetOn(true)
	inv, err := r.c.Inspect(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	want := bmc.OOBInventory{SystemUUID: "4c4c4544-0042-3510-8056-b4c04f4e3432", SerialNumber: "SN-1", Manufacturer: "QEMU",
		Model: "q35", MACs: []string{"52:54:00:ab:cd:ef", "52:54:00:00:00:02"}, Power: bmc.PowerOn}
	if inv.SystemUUID != want.SystemUUID || inv.SerialNumber != want.SerialNumber || inv.Manufacturer != want.Manufacturer ||
		inv.Model != want.Model || !slices.Equal(inv.MACs, want.MACs) || inv.Power != want.Power {
		t.Fatalf("Inspect = %+v, want %+v", inv, want)
	}
}

func TestNormalizeMAC(t *testing.T) {
	tests := map[string]string{"52:54:00:AB:CD:EF": "52:54:00:ab:cd:ef", "52-54-00-ab-cd-ef": "52:54:00:ab:cd:ef",
		"5254.00ab.cdef": "52:54:00:ab:cd:ef", "": "", "00:00:00:00:00:00": "", "zz:54:00:ab:cd:ef": "", "52:54:00": ""}
	for in, want := range tests {
		if got := redfish.NormalizeMAC(in); got != want {
			t.Errorf("NormalizeMAC(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestVirtualMedia(t *testing.T) {
	img := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("iso")) }))
	defer img.Close()
	r := newRig(t, nil, nil)
	if err := r.note(r.c.InsertMedia(ctx(t), img.URL+"/a.iso")); err != nil {
		t.Fatal(err)
	}
	first := r.m.State().Media
	if first == "" {
		t.Fatal("nothing inserted")
	}
	// Same image again: no-op. Another image: eject then insert.
	_ = r.note(r.c.InsertMedia(ctx(t), img.URL+"/a.iso"))
	if r.m.Calls("InsertMedia") != 1 {
		t.Fatalf("re-insert of the same image: %d inserts", r.m.Calls("InsertMedia"))
	}
	if err := r.note(r.c.InsertMedia(ctx(t), img.URL+"/b.iso")); err != nil {
		t.Fatal(err)
	}
	if r.m.Calls("EjectMedia") != 1 || r.m.Calls("InsertMedia") != 2 {
		t.Fatalf("calls %v", r.m.AllCalls())
	}
	if err := r.note(r.c.EjectMedia(ctx(t))); err != nil || r.m.State().Media != "" {
		t.Fatalf("eject: %v, media %q", err, r.m.State().Media)
	}
	if err := r.note(r.c.EjectMedia(ctx(t))); err != nil || r.m.Calls("EjectMedia") != 2 {
		t.Fatalf("eject of an empty CD: %v, calls %v", err, r.m.AllCalls())
	}
}

func TestRotateCredential(t *testing.T) {
	newPass := "Brand-N3w-Passw0rd-0815"
	for _, basic := range []bool{false, true} {
		r := newRig(t, nil, func(o *redfish.Options) { o.BasicAuth = basic })
		if err := r.note(r.c.RotateCredential(ctx(t), newPass)); err != nil {
			t.Fatalf("basic=%v: %v", basic, err)
		}
		// The client keeps working with the new password.
		if _, err := r.c.GetPower(ctx(t)); err != nil {
			t.Fatalf("basic=%v: after rotation: %v", basic, err)
		}
		// The old password no longer logs in.
		_, err := redfish.New(ctx(t), bmc.Endpoint{Address: r.srv.URL, Username: user, Password: pass}, fastOpts(r.logs))
		if r.note(err) == nil {
			t.Fatalf("basic=%v: old password still accepted", basic)
		}
		r.checkNoSecret(t, newPass)
	}
	r := newRig(t, nil, nil)
	if err := r.note(r.c.RotateCredential(ctx(t), "short")); err == nil || !strings.Contains(err.Error(), "PropertyValueFormatError") {
		t.Fatalf("short password: %v", err)
	}
}

func TestWrongPasswordAndNoSessions(t *testing.T) {
	r := newRig(t, func(c *redfishbmc.Config) { c.Quirks.NoSessions = true }, nil)
	if _, err := r.c.GetPower(ctx(t)); err != nil {
		t.Fatalf("basic-auth fallback: %v", err)
	}
	_, err := redfish.New(ctx(t), bmc.Endpoint{Address: r.srv.URL, Username: user, Password: "Wrong-" + pass}, fastOpts(r.logs))
	if r.note(err) == nil {
		t.Fatal("wrong password accepted")
	}
	if !strings.Contains(err.Error(), r.srv.URL) || !strings.Contains(err.Error(), "logging in") {
		t.Fatalf("error lacks context: %v", err)
	}
	r.checkNoSecret(t, "Wrong-"+pass)
}

func TestTLS(t *testing.T) {
	cert, err := redfishbmc.SelfSignedCert("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := redfishbmc.New(redfishbmc.Config{Username: user, Password: pass}, vbmc.NewFakeMachine())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(svc)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert.TLS}}
	srv.StartTLS()
	defer srv.Close()
	other, _ := redfishbmc.SelfSignedCert("127.0.0.1")
	tests := []struct {
		name string
		ep   bmc.Endpoint
		ok   bool
	}{
		{"fingerprint pin", bmc.Endpoint{FingerprintSHA256: cert.FingerprintSHA256}, true},
		{"fingerprint pin with colons, upper case", bmc.Endpoint{FingerprintSHA256: colons(strings.ToUpper(cert.FingerprintSHA256))}, true},
		{"fingerprint mismatch", bmc.Endpoint{FingerprintSHA256: other.FingerprintSHA256}, false},
		{"CA bundle", bmc.Endpoint{CAPEM: cert.PEM}, true},
		{"wrong CA", bmc.Endpoint{CAPEM: other.PEM}, false},
		{"system roots", bmc.Endpoint{}, false},
		{"insecure", bmc.Endpoint{Insecure: true}, true},
		{"bad fingerprint", bmc.Endpoint{FingerprintSHA256: "abc"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ep := tt.ep
			ep.Address, ep.Username, ep.Password = strings.TrimPrefix(srv.URL, "https://"), user, pass
			c, err := redfish.New(ctx(t), ep, fastOpts(&syncBuffer{}))
			if tt.ok != (err == nil) {
				t.Fatalf("New: %v, want ok=%v", err, tt.ok)
			}
			if err != nil {
				if strings.Contains(err.Error(), pass) {
					t.Fatal("password in error")
				}
				return
			}
			defer c.Close(context.Background())
			if _, err := c.GetPower(ctx(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
	if !strings.Contains(fingerprintErr(t, srv.URL, other.FingerprintSHA256), "does not match the pinned") {
		t.Fatal("mismatch error does not say the pin failed")
	}
}

func fingerprintErr(t *testing.T, url, fp string) string {
	_, err := redfish.New(ctx(t), bmc.Endpoint{Address: url, Username: user, Password: pass, FingerprintSHA256: fp}, fastOpts(&syncBuffer{}))
	if err == nil {
		return ""
	}
	return err.Error()
}

func colons(h string) string {
	var parts []string
	for i := 0; i < len(h); i += 2 {
		parts = append(parts, h[i:i+2])
	}
	return strings.Join(parts, ":")
}

func TestBaseURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"10.0.0.5", "https://10.0.0.5"}, {"10.0.0.5:8443", "https://10.0.0.5:8443"},
		{"http://127.0.0.1:80/redfish/v1", "http://127.0.0.1:80"}, {"https://[::1]:443", "https://[::1]:443"},
		{"", ""}, {"ftp://x", ""}, {"https://user:pw@host", ""}, {"https://user:p/w@host", ""},
		{"https://10.0.0.5?token=x", "https://10.0.0.5"}, {"10.0.0.5:8443#x", "https://10.0.0.5:8443"},
	}
	for _, tt := range tests {
		got, err := redfish.BaseURL(tt.in)
		if got != tt.want || (err != nil) != (tt.want == "") {
			t.Errorf("BaseURL(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "pw@") {
			t.Errorf("BaseURL error shows credentials: %v", err)
		}
	}
}

func TestBackoff(t *testing.T) {
	for n, want := range []time.Duration{0, 100, 200, 400, 800, 1000, 1000} {
		if n == 0 {
			continue
		}
		if got := redfish.Backoff(n, 100, 1000, 0); got != want {
			t.Errorf("Backoff(%d) = %d, want %d", n, got, want)
		}
		for range 20 {
			if got := redfish.Backoff(n, 100, 1000, 0.5); got < want/2 || got > want*3/2 {
				t.Errorf("Backoff(%d) with jitter = %d, outside ±50%% of %d", n, got, want)
			}
		}
	}
}

func TestEndpointStringHidesPassword(t *testing.T) {
	r := newRig(t, nil, nil)
	if strings.Contains(r.c.String(), pass) || !strings.Contains(r.c.String(), user) {
		t.Fatalf("String() = %q", r.c.String())
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		if out := fmt.Sprintf(verb, r.c); strings.Contains(out, pass) {
			t.Errorf("%s of the client shows the password: %s", verb, out)
		}
	}
}
