package sitecmd

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"bcd/internal/dhcp"
	"bcd/internal/site"
)

func TestConfig(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	base := flags{server: "https://cp:8443", site: "nyc", dataDir: "/d", dhcpMode: "off", httpListen: ":8080", localBoot: "exit"}
	with := func(mod func(*flags)) flags { f := base; mod(&f); return f }
	read := func(name string) ([]byte, error) {
		if name == "/ca.pem" {
			return []byte("PEM"), nil
		}
		return nil, errors.New("no such file")
	}
	tests := []struct {
		name  string
		f     flags
		err   string
		check func(t *testing.T, f flags)
	}{
		{name: "minimal", f: base},
		{name: "no server", f: with(func(f *flags) { f.server = "" }), err: "--server and --site"},
		{name: "ca file", f: with(func(f *flags) { f.caFile = "/ca.pem" })},
		{name: "missing ca file", f: with(func(f *flags) { f.caFile = "/nope" }), err: "reading --ca-file"},
		{name: "ramdisk", f: with(func(f *flags) {
			f.kernelURL, f.kernelSHA, f.initrdURL, f.initrdSHA = "http://o/k", strings.ToUpper(sha), "http://o/i", sha
			f.ramdiskGateway = "https://cp-public:8443"
		})},
		{name: "ramdisk without digest", f: with(func(f *flags) { f.kernelURL, f.initrdURL = "http://o/k", "http://o/i" }), err: "--ramdisk-*"},
		{name: "server ip", f: with(func(f *flags) { f.serverIP = "10.0.0.1" })},
		{name: "server ip v6", f: with(func(f *flags) { f.serverIP = "fd00::1" }), err: "not an IPv4"},
		{name: "full without pool", f: with(func(f *flags) { f.dhcpMode = "full" }), err: "--dhcp-pool"},
		{name: "full", f: with(func(f *flags) {
			f.dhcpMode, f.dhcpPools, f.dhcpRouters, f.dhcpDNS = "full", []string{"10.0.0.0/24,10.0.0.100-10.0.0.199"}, []string{"10.0.0.1"}, []string{"10.0.0.2"}
		})},
		{name: "pool outside subnet", f: with(func(f *flags) { f.dhcpMode, f.dhcpPools = "full", []string{"10.0.0.0/24,10.0.1.1-10.0.1.9"} }), err: "inside the subnet"},
		{name: "bad router", f: with(func(f *flags) { f.dhcpRouters = []string{"router"} }), err: "--dhcp-router"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := tc.f.config(read)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.GatewayURL != tc.f.server || cfg.Site != tc.f.site || cfg.DataDir != tc.f.dataDir || cfg.DHCPMode != dhcp.Mode(tc.f.dhcpMode) {
				t.Errorf("config %+v", cfg)
			}
			if tc.f.caFile != "" && string(cfg.CAPEM) != "PEM" {
				t.Errorf("CA %q", cfg.CAPEM)
			}
			if tc.f.kernelURL != "" && (cfg.Ramdisk.Kernel.SHA256 != sha || cfg.Ramdisk.GatewayURL != tc.f.ramdiskGateway) {
				t.Errorf("ramdisk %+v", cfg.Ramdisk)
			}
			if tc.f.serverIP != "" && cfg.ServerIP != netip.MustParseAddr(tc.f.serverIP) {
				t.Errorf("server ip %s", cfg.ServerIP)
			}
			if len(tc.f.dhcpPools) > 0 {
				p := cfg.DHCPPools[0]
				if p.Subnet != netip.MustParsePrefix("10.0.0.0/24") || p.Start != netip.MustParseAddr("10.0.0.100") || len(p.Routers) != 1 || len(p.DNS) != 1 {
					t.Errorf("pool %+v", p)
				}
			}
		})
	}
}

func TestRunNeedsServer(t *testing.T) {
	var out, errOut strings.Builder
	err := Run(context.Background(), []string{"--site", "s"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "--server") {
		t.Fatalf("error %v", err)
	}
}

func TestCacheFlags(t *testing.T) {
	base := flags{server: "https://cp:8443", site: "nyc", dataDir: "/d", dhcpMode: "off"}
	tests := []struct {
		max, retain string
		bound       int64
		keep        time.Duration
		err         string
	}{
		{max: "", retain: "", bound: 0, keep: 0}, // the agent's defaults
		{max: "20GiB", retain: "7d", bound: 20 << 30, keep: 7 * 24 * time.Hour},
		{max: "0", retain: "0", bound: -1, keep: -1}, // no bound; kept until the bound needs the room
		{max: "512mib", retain: "36h", bound: 512 << 20, keep: 36 * time.Hour},
		{max: "1073741824", retain: "90m", bound: 1 << 30, keep: 90 * time.Minute},
		{max: "2 TiB", retain: "1d", bound: 2 << 40, keep: 24 * time.Hour},
		{max: "20GB", err: "--cache-max"},
		{max: "-1", err: "--cache-max"},
		{max: "1.5GiB", err: "--cache-max"},
		{max: "9999999TiB", err: "too large"},
		{retain: "-1h", err: "--cache-retain"},
		{retain: "1w", err: "--cache-retain"},
		{retain: "1.5d", err: "--cache-retain"},
	}
	for _, tc := range tests {
		t.Run(tc.max+"/"+tc.retain, func(t *testing.T) {
			f := base
			f.cacheMax, f.cacheRetain = tc.max, tc.retain
			cfg, err := f.config(func(string) ([]byte, error) { return nil, errors.New("none") })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.CacheBound != tc.bound || cfg.CacheRetain != tc.keep {
				t.Fatalf("bound %d, retain %s; want %d, %s", cfg.CacheBound, cfg.CacheRetain, tc.bound, tc.keep)
			}
		})
	}
}

// TestCacheFlagDefaults: the flags' defaults are the agent's.
func TestCacheFlagDefaults(t *testing.T) {
	fl := Command().Flags()
	b, err := ParseSize(fl.Lookup("cache-max").DefValue)
	if err != nil || b != site.DefaultCacheBound {
		t.Errorf("--cache-max default %d (%v), want %d", b, err, site.DefaultCacheBound)
	}
	d, err := ParseRetain(fl.Lookup("cache-retain").DefValue)
	if err != nil || d != site.DefaultCacheRetain {
		t.Errorf("--cache-retain default %s (%v), want %s", d, err, site.DefaultCacheRetain)
	}
}

// A log level the agent does not know is refused, as bcd server refuses it, not taken as info.
func TestLogLevel(t *testing.T) {
	for _, tc := range []struct {
		level string
		ok    bool
	}{{"debug", true}, {"info", true}, {"warn", true}, {"error", true}, {"bogus", false}, {"", false}} {
		_, err := logger(io.Discard, tc.level)
		if (err == nil) != tc.ok {
			t.Errorf("--log-level %q: %v", tc.level, err)
		}
	}
}
