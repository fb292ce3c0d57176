package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestBootModeAndRedfishSystemCLI: --boot-mode at enroll and by node update, through the API to
// the store and back in node output; a bad mode and a Redfish path that names no system are
// refused saying what is accepted.
func TestBootModeAndRedfishSystemCLI(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_BMC_PASSWORD": "pw-from-env"}
	nodeJSON := func(name string) (mode, addr string) {
		t.Helper()
		code, out, errs := run(t, env, "node", "get", name, "-o", "json")
		var resp struct {
			Node struct {
				BootMode string `json:"bootMode"`
				Bmc      struct{ Address string }
			}
		}
		if code != 0 || json.Unmarshal([]byte(out), &resp) != nil {
			t.Fatalf("get %s: %d %q %q", name, code, out, errs)
		}
		return resp.Node.BootMode, resp.Node.Bmc.Address
	}
	steps := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string // in stdout (code 0) or stderr
		node     string // then node's boot mode and BMC address are checked
		mode     string
		addr     string
	}{
		{"enroll legacy, named system", []string{"node", "enroll", "c1", "--boot-mode", "legacy", "--bmc-address", "https://10.0.0.5/redfish/v1/Systems/Node2", "--bmc-username", "root"},
			0, "boot mode:", "c1", "legacy", "https://10.0.0.5/redfish/v1/Systems/Node2"},
		{"enroll with a bad mode", []string{"node", "enroll", "c2", "--boot-mode", "bios", "--bmc-address", "https://10.0.0.6", "--bmc-username", "root"},
			2, "accepted are uefi, legacy, or empty", "", "", ""},
		{"enroll with another path", []string{"node", "enroll", "c3", "--bmc-address", "https://10.0.0.7/redfish/v1/Managers/1", "--bmc-username", "root"},
			2, "/redfish/v1/Systems/ID", "", "", ""},
		{"update to uefi", []string{"node", "update", "c1", "--boot-mode", "uefi", "--reason", "firmware now UEFI"},
			0, "uefi", "c1", "uefi", "https://10.0.0.5/redfish/v1/Systems/Node2"},
		{"update with a bad mode", []string{"node", "update", "c1", "--boot-mode", "efi"},
			2, "accepted are uefi, legacy, or empty", "c1", "uefi", "https://10.0.0.5/redfish/v1/Systems/Node2"},
		{"update with nothing", []string{"node", "update", "c1"},
			2, "nothing to update", "c1", "uefi", "https://10.0.0.5/redfish/v1/Systems/Node2"},
		{"update clears", []string{"node", "update", "c1", "--boot-mode", ""},
			0, "driver default", "c1", "", "https://10.0.0.5/redfish/v1/Systems/Node2"},
	}
	for _, s := range steps {
		code, out, errs := run(t, env, s.args...)
		text := out
		if s.wantCode != 0 {
			text = errs
		}
		if code != s.wantCode || !strings.Contains(text, s.wantOut) || strings.Contains(out+errs, "pw-from-env") {
			t.Fatalf("%s: %d %q %q; want code %d and %q", s.name, code, out, errs, s.wantCode, s.wantOut)
		}
		if s.node == "" {
			continue
		}
		if mode, addr := nodeJSON(s.node); mode != s.mode || addr != s.addr {
			t.Errorf("%s: node %s has boot mode %q, BMC address %q; want %q, %q", s.name, s.node, mode, addr, s.mode, s.addr)
		}
	}
}
