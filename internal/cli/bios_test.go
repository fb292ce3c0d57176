package cli

import (
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
	code, out, errs := run(t, env, "pool", "list", "-o", "json")
	if code != 0 || !strings.Contains(out, `"ProcVirtualization":"Disabled"`) && !strings.Contains(out, `"ProcVirtualization": "Disabled"`) || !strings.Contains(out, "rack 7") {
		t.Fatalf("list: %d %q %q", code, out, errs)
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
	if code, out, errs := run(t, env, "pool", "list", "-o", "json"); code != 0 || strings.Contains(out, "ProcVirtualization") || !strings.Contains(out, `"gpu"`) {
		t.Fatalf("list after an update without settings (the policy is replaced): %d %q %q", code, out, errs)
	}
}
