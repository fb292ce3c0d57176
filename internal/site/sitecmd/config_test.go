package sitecmd

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"bcd/internal/flagconfig"
)

// bcd site run reads BCD_SITE_<FLAG> and its config file; BCD_SERVER, the CLI's API URL, is
// not its --server.
func TestRunConfiguration(t *testing.T) {
	file := "server: https://file:7443\nsite: from-file\ndhcp-dns: [10.0.0.53, 10.0.0.54]\ndrain-timeout: 30s\n"
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want map[string]string
	}{
		{"defaults", nil, nil, map[string]string{"server": "", "data-dir": "/var/lib/bcd/site", "drain-timeout": "1m0s"}},
		{"CLI's BCD_SERVER ignored", nil, map[string]string{"BCD_SERVER": "http://127.0.0.1:7480", "BCD_DATA_DIR": "data"},
			map[string]string{"server": "", "data-dir": "/var/lib/bcd/site"}},
		{"env", nil, map[string]string{"BCD_SITE_SERVER": "https://env:7443", JoinTokenEnv: "bcdj_x", "BCD_SITE_NO_POWER_POLLING": "true"},
			map[string]string{"server": "https://env:7443", "join-token": "bcdj_x", "no-power-polling": "true"}},
		{"file", []string{"--config", "site.yaml"}, nil,
			map[string]string{"server": "https://file:7443", "site": "from-file", "dhcp-dns": "[10.0.0.53,10.0.0.54]", "drain-timeout": "30s"}},
		{"file from env", nil, map[string]string{"BCD_SITE_CONFIG": "site.yaml"}, map[string]string{"site": "from-file"}},
		{"flag > env > file", []string{"--config", "site.yaml", "--site", "flag"}, map[string]string{"BCD_SITE_SITE": "env", "BCD_SITE_SERVER": "https://env:7443"},
			map[string]string{"site": "flag", "server": "https://env:7443", "drain-timeout": "30s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := flagconfig.Source{
				Getenv: func(k string) string { return tc.env[k] },
				ReadFile: func(p string) ([]byte, error) {
					if p == "site.yaml" {
						return []byte(file), nil
					}
					return nil, fmt.Errorf("open %s: %w", p, fs.ErrNotExist)
				},
			}
			cmd := command(src)
			if err := cmd.ParseFlags(tc.args); err != nil {
				t.Fatal(err)
			}
			if err := flagconfig.Apply(cmd.LocalFlags(), Spec(), src); err != nil {
				t.Fatal(err)
			}
			for name, want := range tc.want {
				if got := cmd.Flags().Lookup(name).Value.String(); got != want {
					t.Errorf("--%s = %q, want %q", name, got, want)
				}
			}
		})
	}
}

// A config refused stops the command before it runs, with a *flagconfig.Error (exit code 2 in
// bcd).
func TestRunConfigurationRefused(t *testing.T) {
	src := flagconfig.Source{Getenv: func(string) string { return "" },
		ReadFile: func(string) ([]byte, error) { return []byte("sever: https://x\n"), nil }}
	cmd := command(src)
	cmd.SetArgs([]string{"--config", "site.yaml"})
	err := cmd.Execute()
	if !errors.As(err, new(*flagconfig.Error)) {
		t.Fatalf("unknown key: %v", err)
	}
	if want := `unknown key "sever" (did you mean "server"?)`; !strings.Contains(err.Error(), want) {
		t.Errorf("%v lacks %q", err, want)
	}
}
