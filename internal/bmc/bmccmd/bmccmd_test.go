package bmccmd

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"bcd/internal/bmc"
	"bcd/internal/lab/vbmc"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
)

// creds are the credential flags of a good invocation (the password from a file, debug logs on so
// a leak into logs would show).
func creds(t *testing.T) []string {
	return []string{"--username", testUser, "--password-file", passwordFile(t, testPassword), "--log-level", "debug"}
}

func args(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// noLeak fails when the password shows anywhere the operator can see.
func noLeak(t *testing.T, where ...string) {
	t.Helper()
	for _, s := range where {
		if strings.Contains(s, testPassword) {
			t.Fatalf("password leaked: %q", s)
		}
	}
}

func TestPowerAgainstVirtualBMCs(t *testing.T) {
	for _, b := range allBMCs(t) {
		t.Run(b.name, func(t *testing.T) {
			c := creds(t)
			// Steps run in order on one machine, which starts off.
			steps := []struct {
				verb   string
				want   powerResult
				wantOn bool
			}{
				{"status", powerResult{Power: bmc.PowerOff}, false},
				{"on", powerResult{Action: "on", Power: bmc.PowerOn}, true},
				{"status", powerResult{Power: bmc.PowerOn}, true},
				{"cycle", powerResult{Action: "cycle", Power: bmc.PowerOn}, true},
				{"reset", powerResult{Action: "reset", Power: bmc.PowerOn}, true},
				{"off", powerResult{Action: "off", Power: bmc.PowerOff}, false},
			}
			for _, s := range steps {
				before := b.machine.AllCalls()
				stdout, stderr, err := execute(t, testDeps(nil), args(b.conn, c, []string{"-o", "json", "power", s.verb})...)
				if err != nil {
					t.Fatalf("power %s: %v (stderr %s)", s.verb, err, stderr)
				}
				noLeak(t, stdout, stderr)
				var got powerResult
				if err := json.Unmarshal([]byte(stdout), &got); err != nil {
					t.Fatalf("power %s: output %q: %v", s.verb, stdout, err)
				}
				if got != s.want {
					t.Errorf("power %s = %+v, want %+v", s.verb, got, s.want)
				}
				if on := b.machine.State().On; on != s.wantOn {
					t.Errorf("after power %s the machine is on=%v, want %v", s.verb, on, s.wantOn)
				}
				if s.verb != "status" && reflect.DeepEqual(before, b.machine.AllCalls()) {
					t.Errorf("power %s did not act on the machine (calls %v)", s.verb, before)
				}
			}
		})
	}
}

// soft asks the OS to shut down: the BMC passes it on as the ACPI power button; the machine
// goes off when the OS is done, so the power read back may still be on.
func TestPowerSoft(t *testing.T) {
	for _, b := range allBMCs(t) {
		t.Run(b.name, func(t *testing.T) {
			b.machine.SetOn(true)
			stdout, stderr, err := execute(t, testDeps(nil), args(b.conn, creds(t), []string{"-o", "json", "power", "soft"})...)
			if err != nil {
				t.Fatalf("power soft: %v (stderr %s)", err, stderr)
			}
			var got powerResult
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatalf("output %q: %v", stdout, err)
			}
			if got.Action != "soft" || (got.Power != bmc.PowerOn && got.Power != bmc.PowerOff) {
				t.Errorf("power soft = %+v", got)
			}
			deadline := time.Now().Add(10 * time.Second)
			for b.machine.Calls("Shutdown") == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the machine got no shutdown request (calls %v)", b.machine.AllCalls())
				}
				time.Sleep(5 * time.Millisecond)
			}
			if b.machine.Calls("PowerOff") != 0 {
				t.Error("soft powered the machine off hard")
			}
		})
	}
}

func TestTableOutput(t *testing.T) {
	m := vbmc.NewFakeMachine()
	ib := startIPMI(t, m)
	conn := []string{"--driver", "ipmi", "--address", ib.Addr().String()}
	cases := []struct {
		cmd  []string
		want [][]string
	}{
		{[]string{"power", "on"}, [][]string{{"action", "on"}, {"power", "on"}}},
		{[]string{"bootdev", "cd", "--persistent"}, [][]string{{"device", "cd"}, {"persistent", "true"}, {"mode", "unchanged"}}},
	}
	for _, tc := range cases {
		stdout, _, err := execute(t, testDeps(nil), args(conn, creds(t), tc.cmd)...)
		if err != nil {
			t.Fatalf("%v: %v", tc.cmd, err)
		}
		var got [][]string
		for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
			got = append(got, strings.Fields(line))
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%v printed %q, want rows %v", tc.cmd, stdout, tc.want)
		}
	}
	if st := m.State(); !st.On || st.Boot != vbmc.DeviceCD {
		t.Errorf("machine = %+v", st)
	}
}

func TestPowerJSONShape(t *testing.T) {
	m := vbmc.NewFakeMachine()
	m.SetOn(true)
	rf := startRedfish(t, m, redfishbmc.Quirks{})
	conn := []string{"--driver", "redfish", "--address", rf.url, "--fingerprint", rf.fingerprint}
	stdout, _, err := execute(t, testDeps(nil), args(conn, creds(t), []string{"-o", "json", "power", "status"})...)
	if err != nil {
		t.Fatal(err)
	}
	if stdout != `{"power":"on"}`+"\n" {
		t.Errorf("power status -o json = %q", stdout)
	}
	stdout, _, err = execute(t, testDeps(nil), args(conn, creds(t), []string{"power", "status"})...)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(stdout); !reflect.DeepEqual(got, []string{"power", "on"}) {
		t.Errorf("power status (table) = %q", stdout)
	}
}

func TestBootdevAgainstVirtualBMCs(t *testing.T) {
	for _, b := range allBMCs(t) {
		t.Run(b.name, func(t *testing.T) {
			c := creds(t)
			steps := []struct {
				flags    []string
				want     bootResult
				wantBoot string
			}{
				{[]string{"disk"}, bootResult{Device: bmc.BootDisk, Mode: "unchanged"}, vbmc.DeviceDisk},
				{[]string{"pxe", "--persistent", "--uefi"}, bootResult{Device: bmc.BootPXE, Persistent: true, Mode: "uefi"}, vbmc.DevicePXE},
				{[]string{"disk", "--legacy"}, bootResult{Device: bmc.BootDisk, Mode: "legacy"}, vbmc.DeviceDisk},
				{[]string{"pxe", "--uefi"}, bootResult{Device: bmc.BootPXE, Mode: "uefi"}, vbmc.DevicePXE},
			}
			for _, s := range steps {
				stdout, stderr, err := execute(t, testDeps(nil), args(b.conn, c, []string{"-o", "json", "bootdev"}, s.flags)...)
				if err != nil {
					t.Fatalf("bootdev %v: %v (stderr %s)", s.flags, err, stderr)
				}
				noLeak(t, stdout, stderr)
				var got bootResult
				if err := json.Unmarshal([]byte(stdout), &got); err != nil {
					t.Fatalf("bootdev %v: output %q: %v", s.flags, stdout, err)
				}
				if got != s.want {
					t.Errorf("bootdev %v = %+v, want %+v", s.flags, got, s.want)
				}
				if boot := b.machine.State().Boot; boot != s.wantBoot {
					t.Errorf("after bootdev %v the machine boots %q, want %q", s.flags, boot, s.wantBoot)
				}
			}
		})
	}
}

func TestBootdevJSONShape(t *testing.T) {
	m := vbmc.NewFakeMachine()
	rf := startRedfish(t, m, redfishbmc.Quirks{})
	conn := []string{"--driver", "redfish", "--address", rf.url, "--insecure"}
	stdout, _, err := execute(t, testDeps(nil), args(conn, creds(t), []string{"-o", "json", "bootdev", "pxe", "--uefi"})...)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"device":"pxe","persistent":false,"mode":"uefi"}` + "\n"; stdout != want {
		t.Errorf("bootdev -o json = %q, want %q", stdout, want)
	}
}

// A BMC that answers the boot write with success and does not apply it is an error.
func TestBootdevIgnoredByBMC(t *testing.T) {
	rfm := vbmc.NewFakeMachine()
	rf := startRedfish(t, rfm, redfishbmc.Quirks{IgnoreBootOverride: true})
	ipm := vbmc.NewFakeMachine()
	ib := startIPMI(t, ipm)
	ib.IgnoreBootWrites(true)
	cases := []struct {
		name    string
		conn    []string
		machine *vbmc.FakeMachine
	}{
		{"redfish", []string{"--driver", "redfish", "--address", rf.url, "--fingerprint", rf.fingerprint}, rfm},
		{"ipmi", []string{"--driver", "ipmi", "--address", ib.Addr().String()}, ipm},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, err := execute(t, testDeps(nil), args(tc.conn, creds(t), []string{"bootdev", "disk", "--persistent"})...)
			if err == nil {
				t.Fatalf("bootdev on a BMC that ignores it succeeded: %q", stdout)
			}
			if stdout != "" {
				t.Errorf("output on failure: %q", stdout)
			}
			if !strings.HasPrefix(err.Error(), "bmc bootdev disk at "+tc.conn[3]+" ("+tc.name+"): ") {
				t.Errorf("error does not name operation, address and driver: %v", err)
			}
			noLeak(t, err.Error(), stderr)
			if boot := tc.machine.State().Boot; boot != vbmc.DevicePXE {
				t.Errorf("machine boots %q", boot)
			}
		})
	}
}

func TestInventoryAgainstVirtualBMCs(t *testing.T) {
	for _, b := range allBMCs(t) {
		t.Run(b.name, func(t *testing.T) {
			b.machine.SetOn(true)
			stdout, stderr, err := execute(t, testDeps(nil), args(b.conn, creds(t), []string{"-o", "json", "inventory"})...)
			if err != nil {
				t.Fatalf("inventory: %v (stderr %s)", err, stderr)
			}
			noLeak(t, stdout, stderr)
			var raw map[string]any
			if err := json.Unmarshal([]byte(stdout), &raw); err != nil {
				t.Fatalf("output %q: %v", stdout, err)
			}
			for _, k := range []string{"systemUuid", "serialNumber", "manufacturer", "model", "macs", "power"} {
				if _, ok := raw[k]; !ok {
					t.Errorf("inventory JSON lacks %q: %s", k, stdout)
				}
			}
			var got inventoryResult
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatal(err)
			}
			want := inventoryResult{SystemUUID: testGUID, MACs: []string{}, Power: bmc.PowerOn}
			if strings.HasPrefix(b.name, "redfish") {
				want = inventoryResult{SystemUUID: testUUID, SerialNumber: "SN-42", Manufacturer: "bcd", Model: "virtual",
					MACs: []string{"52:54:00:12:34:56", "52:54:00:ab:cd:ef"}, Power: bmc.PowerOn}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("inventory = %+v, want %+v", got, want)
			}

			stdout, _, err = execute(t, testDeps(nil), args(b.conn, creds(t), []string{"inventory"})...)
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range []string{"uuid", "serial", "manufacturer", "model", "macs", "power"} {
				if !strings.Contains(stdout, "\n"+line+" ") && !strings.HasPrefix(stdout, line+" ") {
					t.Errorf("table lacks %q:\n%s", line, stdout)
				}
			}
			if !strings.Contains(stdout, want.SystemUUID) {
				t.Errorf("table lacks the UUID:\n%s", stdout)
			}
		})
	}
}

func TestWrongPassword(t *testing.T) {
	for _, b := range allBMCs(t) {
		if b.name == "redfish-ca" || b.name == "redfish-insecure" {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			wrong := testPassword + "-wrong"
			c := []string{"--username", testUser, "--password-file", passwordFile(t, wrong), "--log-level", "debug"}
			stdout, stderr, err := execute(t, testDeps(nil), args(b.conn, c, []string{"power", "on"})...)
			if err == nil {
				t.Fatal("wrong password accepted")
			}
			msg := err.Error()
			t.Logf("error: %s", msg)
			if strings.Contains(msg, wrong) || strings.Contains(stdout, wrong) || strings.Contains(stderr, wrong) {
				t.Fatalf("password leaked: err %q stdout %q stderr %q", msg, stdout, stderr)
			}
			noLeak(t, msg, stdout, stderr)
			if !strings.HasPrefix(msg, "bmc power on at "+b.conn[3]+" ") || strings.Contains(msg, "\n") {
				t.Errorf("error is not one line naming operation and address: %q", msg)
			}
			low := strings.ToLower(msg)
			if !strings.Contains(low, "auth") && !strings.Contains(low, "401") && !strings.Contains(low, "password") {
				t.Errorf("error does not say the login was refused: %q", msg)
			}
			if b.machine.State().On {
				t.Error("machine powered on with a wrong password")
			}
		})
	}
}

func TestPasswordFromEnvironment(t *testing.T) {
	m := vbmc.NewFakeMachine()
	ib := startIPMI(t, m)
	d := testDeps(map[string]string{PasswordEnv: testPassword})
	stdout, stderr, err := execute(t, d, "--driver", "ipmi", "--address", ib.Addr().String(), "--username", testUser,
		"--log-level", "debug", "-o", "json", "power", "on")
	if err != nil {
		t.Fatalf("%v (stderr %s)", err, stderr)
	}
	noLeak(t, stdout, stderr)
	if !m.State().On {
		t.Error("machine is off")
	}
}

func TestTLSPinMismatch(t *testing.T) {
	m := vbmc.NewFakeMachine()
	rf := startRedfish(t, m, redfishbmc.Quirks{})
	other := strings.Repeat("ab", 32)
	_, stderr, err := execute(t, testDeps(nil), args([]string{"--driver", "redfish", "--address", rf.url,
		"--fingerprint", other}, creds(t), []string{"power", "on"})...)
	if err == nil {
		t.Fatal("a wrong pin was accepted")
	}
	if !strings.Contains(err.Error(), "fingerprint") || !strings.HasPrefix(err.Error(), "bmc power on at "+rf.url) {
		t.Errorf("error = %v", err)
	}
	noLeak(t, err.Error(), stderr)
	if m.State().On || m.Calls("PowerOn") != 0 {
		t.Error("machine acted on through an unverified connection")
	}
}

// Flags are checked before any BMC is contacted; every error names what is accepted and none
// carries the password.
func TestBadFlags(t *testing.T) {
	pw := passwordFile(t, testPassword)
	ok := []string{"--driver", "ipmi", "--address", "127.0.0.1:1", "--username", testUser, "--password-file", pw}
	without := func(flag string) []string {
		var out []string
		for i := 0; i < len(ok); i += 2 {
			if ok[i] != flag {
				out = append(out, ok[i], ok[i+1])
			}
		}
		return out
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n"+testPassword), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"bad action", args(ok, []string{"power", "sleep"}), `unknown action "sleep": accepted are status, on, off, soft, cycle, reset`},
		{"no action", args(ok, []string{"power"}), "accepted are status, on, off, soft, cycle, reset"},
		{"two actions", args(ok, []string{"power", "on", "off"}), "accepted are status, on, off, soft, cycle, reset"},
		{"bad device", args(ok, []string{"bootdev", "usb"}), "accepted are pxe, disk, cd"},
		{"no device", args(ok, []string{"bootdev"}), "accepted are pxe, disk, cd"},
		{"uefi and legacy", args(ok, []string{"bootdev", "pxe", "--uefi", "--legacy"}), "--uefi and --legacy exclude each other"},
		{"inventory args", args(ok, []string{"inventory", "all"}), "unknown command"},
		{"bad driver", args([]string{"--driver", "amt"}, without("--driver"), []string{"power", "status"}), `--driver "amt" is not accepted: accepted are redfish, ipmi`},
		{"no driver", args(without("--driver"), []string{"power", "status"}), "--driver is required: accepted are redfish, ipmi"},
		{"bad output", args(ok, []string{"-o", "yaml", "power", "status"}), `-o "yaml" is not accepted: accepted are table, json`},
		{"no address", args(without("--address"), []string{"power", "status"}), "--address is required"},
		{"no username", args(without("--username"), []string{"power", "status"}), "--username is required"},
		{"no password", args(without("--password-file"), []string{"power", "status"}), "give --password-file FILE or set $" + PasswordEnv},
		{"missing password file", args(without("--password-file"), []string{"--password-file", "/nonexistent/pw", "power", "status"}), "reading --password-file /nonexistent/pw"},
		{"empty first line", args(without("--password-file"), []string{"--password-file", empty, "power", "status"}), "the first line is empty"},
		{"password as flag", args(ok, []string{"--password", testPassword, "power", "status"}), "unknown flag: --password"},
		{"password as flag=", args(ok, []string{"--password=" + testPassword, "power", "status"}), "unknown flag: --password"},
		{"zero timeout", args(ok, []string{"--timeout", "0s", "power", "status"}), "--timeout 0s must be positive"},
		{"bad log level", args(ok, []string{"--log-level", "loud", "power", "status"}), "accepted are debug, info, warn, error"},
		{"tls flag on ipmi", args(ok, []string{"--insecure", "power", "status"}), "apply to --driver redfish only"},
		{"two tls flags", args([]string{"--driver", "redfish", "--insecure", "--fingerprint", strings.Repeat("0", 64)}, without("--driver"), []string{"power", "status"}), "at most one of --insecure, --ca, --fingerprint"},
		{"bad fingerprint", args([]string{"--driver", "redfish", "--fingerprint", "abc"}, without("--driver"), []string{"power", "status"}), "64 hex digits"},
		{"missing ca", args([]string{"--driver", "redfish", "--ca", "/nonexistent/ca.pem"}, without("--driver"), []string{"power", "status"}), "reading --ca"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, err := execute(t, testDeps(nil), tc.args...)
			if err == nil {
				t.Fatalf("accepted: %q", stdout)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
			noLeak(t, err.Error())
			if stdout != "" {
				t.Errorf("output on failure: %q", stdout)
			}
			noLeak(t, stderr)
		})
	}
}

func TestPasswordSources(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lf := write("lf", "pw one\n")
	crlf := write("crlf", "pw-two\r\nignored\n")
	bare := write("bare", "pw3")
	cases := []struct {
		name, file, env, want string
		wantErr               bool
	}{
		{"file with newline", lf, "", "pw one", false},
		{"file with CRLF and more lines", crlf, "", "pw-two", false},
		{"file without newline", bare, "", "pw3", false},
		{"file wins over env", bare, "from-env", "pw3", false},
		{"env", "", "from-env", "from-env", false},
		{"neither", "", "", "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := password(tc.file, func(k string) string {
				if k == PasswordEnv {
					return tc.env
				}
				return ""
			}, os.ReadFile)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("password = %q, %v; want %q (error %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestNormalizeFingerprint(t *testing.T) {
	hex64 := strings.Repeat("0a", 32)
	cases := []struct{ in, want string }{
		{hex64, hex64},
		{strings.ToUpper(hex64), hex64},
		{strings.TrimSuffix(strings.Repeat("0A:", 32), ":"), hex64},
		{"xyz", ""},
		{hex64 + "00", ""},
	}
	for _, tc := range cases {
		got, err := normalizeFingerprint(tc.in)
		if got != tc.want || (err != nil) != (tc.want == "") {
			t.Errorf("normalizeFingerprint(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestRedact(t *testing.T) {
	base := errors.New("login as admin with " + testPassword + " refused")
	if got := redact(base, testPassword).Error(); strings.Contains(got, testPassword) || !strings.Contains(got, "[redacted]") {
		t.Errorf("redact = %q", got)
	}
	plain := errors.New("refused")
	if redact(plain, testPassword) != plain {
		t.Error("an error without the password was rewritten")
	}
	if got := oneLine(errors.New("a\nb\r\nc")).Error(); got != "a b c" {
		t.Errorf("oneLine = %q", got)
	}
}

// Mounted under a root that has its own persistent -o (the bcd CLI), the command's -o wins.
func TestMountedUnderRoot(t *testing.T) {
	m := vbmc.NewFakeMachine()
	ib := startIPMI(t, m)
	root := &cobra.Command{Use: "bcd", SilenceErrors: true, SilenceUsage: true}
	var rootOut string
	root.PersistentFlags().StringVarP(&rootOut, "output", "o", "table", "output format")
	root.AddCommand(newCommand(testDeps(nil)))
	var out, errb strings.Builder
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(args([]string{"-o", "json", "bmc", "--driver", "ipmi", "--address", ib.Addr().String()}, creds(t),
		[]string{"power", "status"}))
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != `{"power":"off"}`+"\n" {
		t.Errorf("output = %q", got)
	}
}

func TestTimeout(t *testing.T) {
	// A UDP port nobody answers on loopback: the IPMI driver retransmits until --timeout.
	ib := startIPMI(t, vbmc.NewFakeMachine())
	addr := ib.Addr().String()
	if err := ib.Close(); err != nil {
		t.Fatal(err)
	}
	_, _, err := execute(t, testDeps(nil), args([]string{"--driver", "ipmi", "--address", addr, "--timeout", "700ms"}, creds(t),
		[]string{"power", "status"})...)
	if err == nil {
		t.Fatal("a silent BMC answered")
	}
	t.Logf("error: %v", err)
	if !strings.HasPrefix(err.Error(), "bmc power status at "+addr+" (ipmi): ") {
		t.Errorf("error = %v", err)
	}
}
