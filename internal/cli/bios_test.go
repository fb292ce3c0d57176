package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// bcd pool create/update --bios-setting: the settings reach the pool's policy (pool list shows
// them); a flag without "=" is a usage error before anything is sent; the server's refusals
// (a password, an ipmi profile) come back as invalid_argument naming the field; an update
// without the flag replaces the policy with one without settings.
func TestPoolBIOSSettingFlag(t *testing.T) {
	url, token := startServer(t)
	env := map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}
	if code, out, errs := run(t, env, "pool", "create", "gpu", "--bios-setting", "ProcVirtualization=Disabled", "--bios-setting", "AssetTag=rack 7"); code != 0 {
		t.Fatalf("create: %d %q %q", code, out, errs)
	}
	// settings is the gpu pool's BIOS settings as pool list -o json shows them (protojson's
	// spacing varies: decoded, not matched as text).
	settings := func() map[string]string {
		t.Helper()
		code, out, errs := run(t, env, "pool", "list", "-o", "json")
		var list struct {
			Pools []struct {
				Name   string
				Policy struct {
					BIOSSettings map[string]string `json:"biosSettings"`
				}
			}
		}
		if code != 0 || json.Unmarshal([]byte(out), &list) != nil {
			t.Fatalf("list: %d %q %q", code, out, errs)
		}
		for _, p := range list.Pools {
			if p.Name == "gpu" {
				return p.Policy.BIOSSettings
			}
		}
		t.Fatalf("list has no pool gpu: %q", out)
		return nil
	}
	if got := settings(); len(got) != 2 || got["ProcVirtualization"] != "Disabled" || got["AssetTag"] != "rack 7" {
		t.Fatalf("settings after create: %v", got)
	}
	for _, tc := range []struct {
		args     []string
		code     int
		contains []string
	}{
		{[]string{"pool", "update", "gpu", "--bios-setting", "ProcVirtualization"}, 2, []string{"--bios-setting", "attribute=value"}},
		{[]string{"pool", "update", "gpu", "--bios-setting", "SetupPassword=x"}, 2, []string{"invalid_argument", "policy.bios_settings", "password"}},
		{[]string{"pool", "update", "gpu", "--hardware-profile", "ipmi", "--bios-setting", "ProcVirtualization=Disabled"}, 2, []string{"invalid_argument", "policy.bios_settings", "ipmi"}},
	} {
		code, out, errs := run(t, env, tc.args...)
		if code != tc.code {
			t.Errorf("%v: exit %d, want %d (%q %q)", tc.args, code, tc.code, out, errs)
		}
		for _, c := range tc.contains {
			if !strings.Contains(errs, c) {
				t.Errorf("%v: %q does not say %q", tc.args, errs, c)
			}
		}
	}
	if code, out, errs := run(t, env, "pool", "update", "gpu"); code != 0 {
		t.Fatalf("update without settings: %d %q %q", code, out, errs)
	}
	if got := settings(); len(got) != 0 {
		t.Fatalf("settings after an update without them (the policy is replaced): %v", got)
	}
}
