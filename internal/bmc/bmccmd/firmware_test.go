package bmccmd

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"bcd/internal/bmc"
	"bcd/internal/lab/vbmc"
	redfishbmc "bcd/internal/lab/vbmc/redfish"
)

// bcd bmc firmware against the virtual Redfish BMC: list prints what the BMC reports; update has
// it fetch and install an image, its task followed to the end with progress on stderr; the new
// version runs after a power cycle. IPMI cannot install; a bad URL is refused before dialling.
func TestFirmwareAgainstVirtualBMC(t *testing.T) {
	m := vbmc.NewFakeMachine()
	m.SetOn(true)
	rf := startRedfish(t, m, redfishbmc.Quirks{})
	conn := []string{"--driver", "redfish", "--address", rf.url, "--fingerprint", rf.fingerprint}
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(redfishbmc.FirmwareImage("BIOS", "2.0"))
	}))
	defer origin.Close()
	list := func() []bmc.Firmware {
		t.Helper()
		stdout, stderr, err := execute(t, testDeps(nil), args(conn, creds(t), []string{"-o", "json", "firmware", "list"})...)
		if err != nil {
			t.Fatalf("firmware list: %v (stderr %s)", err, stderr)
		}
		noLeak(t, stdout, stderr)
		var r firmwareResult
		if err := json.Unmarshal([]byte(stdout), &r); err != nil {
			t.Fatalf("output %q: %v", stdout, err)
		}
		return r.Firmware
	}
	version := func(fw []bmc.Firmware, comp string) string {
		f, _ := bmc.FindFirmware(fw, comp)
		return f.Version
	}
	if fw := list(); version(fw, "BMC") != "bcd-vbmc-1" || version(fw, "BIOS") != "" {
		t.Fatalf("firmware before the update: %+v", fw)
	}
	stdout, stderr, err := execute(t, testDeps(nil), args(conn, creds(t), []string{"-o", "json", "firmware", "update", origin.URL + "/bios.bin?token=s3cr3t", "BIOS"})...)
	if err != nil {
		t.Fatalf("firmware update: %v (stderr %s)", err, stderr)
	}
	var res firmwareUpdateResult
	if err := json.Unmarshal([]byte(stdout), &res); err != nil || !res.Done || strings.Contains(stdout, "s3cr3t") {
		t.Fatalf("firmware update output %q (%v)", stdout, err)
	}
	if !strings.Contains(stderr, "firmware update: 100%") {
		t.Errorf("no progress on stderr: %q", stderr)
	}
	if v := version(list(), "BIOS"); v != "" {
		t.Fatalf("before the reset the BIOS runs %q, want the update staged", v)
	}
	if _, stderr, err := execute(t, testDeps(nil), args(conn, creds(t), []string{"power", "cycle"})...); err != nil {
		t.Fatalf("power cycle: %v (%s)", err, stderr)
	}
	if v := version(list(), "BIOS"); v != "2.0" {
		t.Fatalf("after the reset the BIOS runs %q, want 2.0", v)
	}
	stdout, _, err = execute(t, testDeps(nil), args(conn, creds(t), []string{"firmware", "list"})...)
	if err != nil || !strings.Contains(stdout, "BIOS") || !strings.Contains(stdout, "2.0") {
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
		{"ipmi update", ipmiConn, []string{"firmware", "update", origin.URL + "/bios.bin", "BIOS"}, "the driver cannot install firmware (Redfish only)"},
		{"not a URL", conn, []string{"firmware", "update", "/tmp/bios.bin", "BIOS"}, "use http(s)://host/path"},
		{"no component", conn, []string{"firmware", "update", origin.URL + "/bios.bin"}, "requires at least 2 arg(s)"},
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
