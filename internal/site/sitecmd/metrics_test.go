package sitecmd

import (
	"net/netip"
	"strings"
	"testing"

	"bcd/internal/flagconfig"
	"bcd/internal/site"
)

// --metrics-listen: loopback by default (no port of the other defaults), off or an address as
// given (flag, $BCD_SITE_METRICS_LISTEN or the file's metrics-listen), anything else refused.
func TestMetricsListenFlag(t *testing.T) {
	def, err := netip.ParseAddrPort(site.DefaultMetricsListen)
	if err != nil || !def.Addr().IsLoopback() {
		t.Fatalf("default %q is not a loopback address: %v", site.DefaultMetricsListen, err)
	}
	for _, other := range []string{":8080", ":69", ":7480", ":7443"} { // boot HTTP, TFTP, the server's API and gateway
		if strings.HasSuffix(site.DefaultMetricsListen, other) {
			t.Errorf("default %s shares a port with %s", site.DefaultMetricsListen, other)
		}
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		file string
		want string // cfg.MetricsListen
		err  string
	}{
		{name: "default", want: site.DefaultMetricsListen},
		{name: "off", args: []string{"--metrics-listen", "off"}, want: "off"},
		{name: "env", env: map[string]string{"BCD_SITE_METRICS_LISTEN": "0.0.0.0:9481"}, want: "0.0.0.0:9481"},
		{name: "file", args: []string{"--config", "site.yaml"}, file: "metrics-listen: off\n", want: "off"},
		{name: "no port", args: []string{"--metrics-listen", "127.0.0.1"}, err: `--metrics-listen "127.0.0.1": want HOST:PORT`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := flagconfig.Source{Getenv: func(k string) string { return tc.env[k] },
				ReadFile: func(string) ([]byte, error) { return []byte(tc.file), nil }}
			var f flags
			cmd := command(src)
			if err := cmd.ParseFlags(append([]string{"--server", "https://cp:7443", "--site", "s1"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			if err := flagconfig.Apply(cmd.LocalFlags(), Spec(), src); err != nil {
				t.Fatal(err)
			}
			f.metricsListen = cmd.Flags().Lookup("metrics-listen").Value.String()
			f.server, f.site, f.dataDir, f.dhcpMode, f.localBoot = "https://cp:7443", "s1", "/d", "off", "exit"
			cfg, err := f.config(nil)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.MetricsListen != tc.want {
				t.Errorf("MetricsListen %q, want %q", cfg.MetricsListen, tc.want)
			}
		})
	}
}
