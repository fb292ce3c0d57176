package bmccmd

import (
	"encoding/json"
	"strings"
	"testing"

	"bcd/internal/lab/vbmc"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
)

// bcd bmc bios against the virtual Redfish BMC: get reads named attributes (all without
// names), set writes the differing ones pending, a power cycle applies them, get shows them;
// IPMI has no BIOS settings; bad arguments are refused before the BMC is dialled.
func TestBIOSAgainstVirtualBMC(t *testing.T) {
	m := vbmc.NewFakeMachine()
	m.SetOn(true)
	rf := startRedfish(t, m, redfishbmc.Quirks{})
	conn := []string{"--driver", "redfish", "--address", rf.url, "--fingerprint", rf.fingerprint}
	get := func(names ...string) map[string]string {
		t.Helper()
		stdout, stderr, err := execute(t, testDeps(nil), args(conn, creds(t), append([]string{"-o", "json", "bios", "get"}, names...))...)
		if err != nil {
			t.Fatalf("bios get: %v (stderr %s)", err, stderr)
		}
		noLeak(t, stdout, stderr)
		var r biosResult
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatalf("output %q: %v", stdout, err)
		}
		return r.Attributes
	}
	if got := get("ProcVirtualization", "ProcCoreDisable", "NoSuchKnob"); len(got) != 2 || got["ProcVirtualization"] != "Enabled" || got["ProcCoreDisable"] != "0" {
		t.Fatalf("get named: %v", got)
	}
	if all := get(); all["BootMode"] != "Uefi" || all["EmbNicPxe"] != "true" || len(all) < 5 {
		t.Fatalf("get all: %v", all)
	}
	stdout, stderr, err := execute(t, testDeps(nil), args(conn, creds(t), []string{"-o", "json", "bios", "set", "ProcVirtualization=Disabled", "EmbNicPxe=true"})...)
	if err != nil {
		t.Fatalf("bios set: %v (stderr %s)", err, stderr)
	}
	var set biosSetResult
	if err := json.Unmarshal([]byte(stdout), &set); err != nil || len(set.Changed) != 1 || set.Changed[0] != "ProcVirtualization" || !set.Pending {
		t.Fatalf("bios set output %q (%v)", stdout, err)
	}
	if got := get("ProcVirtualization")["ProcVirtualization"]; got != "Enabled" {
		t.Fatalf("before the reset: %s, want Enabled (pending)", got)
	}
	if _, stderr, err := execute(t, testDeps(nil), args(conn, creds(t), []string{"power", "cycle"})...); err != nil {
		t.Fatalf("power cycle: %v (%s)", err, stderr)
	}
	if got := get("ProcVirtualization")["ProcVirtualization"]; got != "Disabled" {
		t.Fatalf("after the reset: %s, want Disabled", got)
	}
	// The table: one attribute per line, sorted.
	stdout, _, err = execute(t, testDeps(nil), args(conn, creds(t), []string{"bios", "get", "ProcVirtualization", "BootMode"})...)
	if err != nil || !strings.HasPrefix(stdout, "BootMode") || !strings.Contains(stdout, "\nProcVirtualization  Disabled") {
		t.Fatalf("table %q (%v)", stdout, err)
	}

	ipmi := allBMCs(t)
	ipmiConn := ipmi[len(ipmi)-1].conn
	for _, tc := range []struct {
		name string
		conn []string
		cmd  []string
		want string
	}{
		{"ipmi get", ipmiConn, []string{"bios", "get"}, "the driver cannot read BIOS settings (Redfish only)"},
		{"ipmi set", ipmiConn, []string{"bios", "set", "A=b"}, "the driver cannot change BIOS settings (Redfish only)"},
		{"no equals", conn, []string{"bios", "set", "ProcVirtualization"}, `"ProcVirtualization": use ATTRIBUTE=VALUE`},
		{"twice", conn, []string{"bios", "set", "A=1", "A=2"}, "attribute A is given twice"},
		{"unknown attribute", conn, []string{"bios", "set", "NoSuchKnob=On"}, "does not report BIOS attribute(s) NoSuchKnob"},
		{"not an integer", conn, []string{"bios", "set", "ProcCoreDisable=two"}, `"two" is not an integer`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, err := execute(t, testDeps(nil), args(tc.conn, creds(t), tc.cmd)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v: %v, want an error saying %q", tc.cmd, err, tc.want)
			}
			noLeak(t, stdout, stderr+err.Error())
		})
	}
}
