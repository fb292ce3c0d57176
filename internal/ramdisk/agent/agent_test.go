package agent

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"bcd/internal/pki"
)

// leafPEM is a certificate that is not a CA's.
func leafPEM(t *testing.T) []byte {
	t.Helper()
	ca, err := pki.CreateCA("bcd test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	certPEM, _, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return certPEM
}

const tok = "AbCdEfGhIjKlMnOpQrSt-_.~+/="

func testCA(t *testing.T) []byte {
	t.Helper()
	ca, err := pki.CreateCA("bcd test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return ca.CertPEM()
}

func TestParseCmdline(t *testing.T) {
	caPEM := testCA(t)
	caArg := " bcd.ca=" + EncodeCA(caPEM)
	gw := "bcd.gateway=https://gw.example:8443/agent" + caArg
	tests := []struct {
		name    string
		line    string
		want    BootParams
		wantErr string
	}{
		{"join", "console=ttyS0 initrd=initrd " + gw + " bcd.token=" + tok + " quiet",
			BootParams{GatewayURL: "https://gw.example:8443/agent", Token: tok, Mode: ModeJoin, CAPEM: caPEM}, ""},
		{"join explicit", gw + " bcd.token=" + tok + " bcd.mode=join",
			BootParams{GatewayURL: "https://gw.example:8443/agent", Token: tok, Mode: ModeJoin, CAPEM: caPEM}, ""},
		{"discovery", gw + " bcd.mode=discovery",
			BootParams{GatewayURL: "https://gw.example:8443/agent", Mode: ModeDiscovery, CAPEM: caPEM}, ""},
		{"discovery without CA", "bcd.gateway=https://gw.example:8443/agent bcd.mode=discovery",
			BootParams{GatewayURL: "https://gw.example:8443/agent", Mode: ModeDiscovery}, ""},
		{"join without CA", "bcd.gateway=https://gw.example:8443/agent bcd.token=" + tok, BootParams{}, "bcd.ca is missing"},
		{"join over http", "bcd.gateway=http://gw.example:8080/ bcd.token=" + tok + caArg, BootParams{}, "must be an https URL"},
		{"duplicate CA", gw + caArg + " bcd.token=" + tok, BootParams{}, "bcd.ca given twice"},
		{"CA padded", gw[:len(gw)-len(caArg)] + " bcd.ca=" + base64.URLEncoding.EncodeToString(caPEM) + " bcd.token=" + tok, BootParams{}, "not unpadded base64url"},
		{"CA std base64 alphabet", gw[:len(gw)-len(caArg)] + " bcd.ca=" + EncodeCA(caPEM)[:8] + "+" + EncodeCA(caPEM)[9:] + " bcd.token=" + tok, BootParams{}, "not unpadded base64url"},
		{"CA empty", gw[:len(gw)-len(caArg)] + " bcd.ca= bcd.token=" + tok, BootParams{}, "must be 1..3072"},
		{"CA not PEM", gw[:len(gw)-len(caArg)] + " bcd.ca=" + EncodeCA([]byte("hello reboot")) + " bcd.token=" + tok, BootParams{}, "data outside the PEM"},
		{"CA with junk before", gw[:len(gw)-len(caArg)] + " bcd.ca=" + EncodeCA(append([]byte("x\n"), caPEM...)) + " bcd.token=" + tok, BootParams{}, "data outside the PEM"},
		{"CA with junk after", gw[:len(gw)-len(caArg)] + " bcd.ca=" + EncodeCA(append(bytes.Clone(caPEM), "x"...)) + " bcd.token=" + tok, BootParams{}, "data outside the PEM"},
		{"CA key block", gw[:len(gw)-len(caArg)] + " bcd.ca=" + EncodeCA(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})) + " bcd.token=" + tok, BootParams{}, "not a plain CERTIFICATE"},
		{"CA garbage cert", gw[:len(gw)-len(caArg)] + " bcd.ca=" + EncodeCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2}})) + " bcd.token=" + tok, BootParams{}, "does not parse"},
		{"CA not a CA", gw[:len(gw)-len(caArg)] + " bcd.ca=" + EncodeCA(leafPEM(t)) + " bcd.token=" + tok, BootParams{}, "not a CA certificate"},
		{"CA two certificates", "bcd.gateway=https://gw.example:8443/agent bcd.token=" + tok + " bcd.ca=" + EncodeCA(append(bytes.Clone(caPEM), caPEM...)),
			BootParams{GatewayURL: "https://gw.example:8443/agent", Token: tok, Mode: ModeJoin, CAPEM: append(bytes.Clone(caPEM), caPEM...)}, ""},
		{"ipv6 literal", "bcd.gateway=http://[fd00::1]:8080/ bcd.mode=discovery",
			BootParams{GatewayURL: "http://[fd00::1]:8080/", Mode: ModeDiscovery}, ""},
		{"no gateway", "bcd.token=" + tok, BootParams{}, "bcd.gateway is missing"},
		{"no token no mode", gw, BootParams{}, "no bcd.token and not bcd.mode=discovery"},
		{"token and discovery", gw + " bcd.token=" + tok + " bcd.mode=discovery", BootParams{}, "together"},
		{"bad mode", gw + " bcd.mode=rescue", BootParams{}, "bcd.mode must be"},
		{"duplicate gateway", gw + " bcd.gateway=https://evil/ bcd.token=" + tok, BootParams{}, "bcd.gateway given twice"},
		{"duplicate token", gw + " bcd.token=" + tok + " bcd.token=" + tok, BootParams{}, "bcd.token given twice"},
		{"unknown bcd key", gw + " bcd.token=" + tok + " bcd.debug=1", BootParams{}, `unknown key "bcd.debug"`},
		{"site URL", gw + " bcd.token=" + tok + " libata.ignore_hpa=1 bcd_site=http://10.0.0.1:8080",
			BootParams{GatewayURL: "https://gw.example:8443/agent", Token: tok, Mode: ModeJoin, CAPEM: caPEM, SiteURL: "http://10.0.0.1:8080"}, ""},
		{"site URL not http", gw + " bcd.token=" + tok + " bcd_site=ftp://10.0.0.1", BootParams{}, "bcd_site: URL scheme must be http or https"},
		{"site URL twice", gw + " bcd.token=" + tok + " bcd_site=http://a:1 bcd_site=http://b:1", BootParams{}, "bcd_site given twice"},
		{"odd bcd key not echoed", gw + " bcd.x$(reboot)=1", BootParams{}, "odd characters"},
		{"ftp", "bcd.gateway=ftp://h/ bcd.mode=discovery", BootParams{}, "http or https"},
		{"user info", "bcd.gateway=http://u:p@h/ bcd.mode=discovery", BootParams{}, "no user info"},
		{"discovery with report", gw + " bcd.mode=discovery bcd.report=http://10.0.0.1:8080/discovery bcd.bootmac=52:54:00:AB:CD:EF",
			BootParams{GatewayURL: "https://gw.example:8443/agent", Mode: ModeDiscovery, CAPEM: caPEM, ReportURL: "http://10.0.0.1:8080/discovery", BootMAC: "52:54:00:ab:cd:ef"}, ""},
		{"report without boot MAC", gw + " bcd.mode=discovery bcd.report=http://10.0.0.1:8080/discovery", BootParams{}, "go together"},
		{"boot MAC without report", gw + " bcd.mode=discovery bcd.bootmac=52:54:00:ab:cd:ef", BootParams{}, "go together"},
		{"report in join mode", gw + " bcd.token=" + tok + " bcd.report=http://10.0.0.1:8080/discovery bcd.bootmac=52:54:00:ab:cd:ef", BootParams{}, "only"},
		{"bad report URL", gw + " bcd.mode=discovery bcd.report=http://h/;reboot bcd.bootmac=52:54:00:ab:cd:ef", BootParams{}, "forbidden character"},
		{"bad boot MAC", gw + " bcd.mode=discovery bcd.report=http://10.0.0.1:8080/discovery bcd.bootmac=evil", BootParams{}, "bcd.bootmac"},
		{"no host", "bcd.gateway=http:/// bcd.mode=discovery", BootParams{}, "needs a host"},
		{"quote", `bcd.gateway="http://h/" bcd.mode=discovery`, BootParams{}, "forbidden character"},
		{"script", "bcd.gateway=http://h/;reboot bcd.mode=discovery", BootParams{}, "forbidden character at offset 9"},
		{"short token", gw + " bcd.token=short", BootParams{}, "token must be 16..512"},
		{"bad token char", gw + " bcd.token=" + tok + "$x", BootParams{}, "forbidden character"},
		{"too long", gw + " bcd.token=" + tok + " " + strings.Repeat("x", 5000), BootParams{}, "at most 4096"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCmdline(tc.line)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				if strings.Contains(err.Error(), tok) || strings.Contains(err.Error(), "evil") || strings.Contains(err.Error(), "reboot") {
					t.Fatalf("error echoes the command line: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.GatewayURL != tc.want.GatewayURL || got.Token != tc.want.Token || got.Mode != tc.want.Mode || !bytes.Equal(got.CAPEM, tc.want.CAPEM) ||
				got.ReportURL != tc.want.ReportURL || got.BootMAC != tc.want.BootMAC {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestTokenNeverLogged(t *testing.T) {
	p := BootParams{GatewayURL: "http://h/", Token: tok, Mode: ModeJoin}
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("x", "params", p)
	if s := buf.String() + p.String(); strings.Contains(s, tok) {
		t.Fatalf("token leaked: %s", s)
	}
}

type fakeNet struct {
	mu      sync.Mutex
	nics    []NIC
	carrier map[string]bool
	addrs   []string
	routes  []string
}

func (f *fakeNet) Interfaces() ([]NIC, error) { return f.nics, nil }
func (f *fakeNet) LinkUp(string) error        { return nil }
func (f *fakeNet) Carrier(n string) (bool, error) {
	return f.carrier[n], nil
}
func (f *fakeNet) AddAddress(i int, p netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.addrs = append(f.addrs, p.String())
	return nil
}
func (f *fakeNet) AddDefaultRoute(i int, gw netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.routes = append(f.routes, gw.String())
	return nil
}

type fakeDHCP struct {
	mu    sync.Mutex
	fails map[string]int // failures before success per NIC; -1 never succeeds
	calls map[string]int
}

func (f *fakeDHCP) Lease(ctx context.Context, ifname string, _ net.HardwareAddr) (Lease, error) {
	f.mu.Lock()
	f.calls[ifname]++
	n, fails := f.calls[ifname], f.fails[ifname]
	f.mu.Unlock()
	if fails < 0 || n <= fails {
		return Lease{}, errors.New("timeout")
	}
	last := byte(10 + len(ifname))
	if ifname == "eth1" {
		last = 99
	}
	return Lease{Interface: ifname, Address: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 2, last}), 24),
		Router: netip.MustParseAddr("10.0.2.2")}, nil
}

func twoNICs() *fakeNet {
	return &fakeNet{nics: []NIC{
		{Name: "eth0", Index: 2, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}},
		{Name: "eth1", Index: 3, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}},
	}, carrier: map[string]bool{"eth0": true, "eth1": true}}
}

func TestConfigureNetwork(t *testing.T) {
	tests := []struct {
		name      string
		carrier   map[string]bool
		fails     map[string]int
		wantAddrs []string
		wantRoute []string
		wantErr   string
	}{
		{"both", nil, map[string]int{}, []string{"10.0.2.14/24", "10.0.2.99/24"}, []string{"10.0.2.2"}, ""},
		{"retry then lease", nil, map[string]int{"eth0": 2, "eth1": -1}, []string{"10.0.2.14/24"}, []string{"10.0.2.2"}, ""},
		{"no link on eth0", map[string]bool{"eth1": true}, map[string]int{}, []string{"10.0.2.99/24"}, []string{"10.0.2.2"}, ""},
		{"nothing", nil, map[string]int{"eth0": -1, "eth1": -1}, nil, nil, "no DHCP lease on any interface"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := twoNICs()
			if tc.carrier != nil {
				n.carrier = tc.carrier
			}
			d := &fakeDHCP{fails: tc.fails, calls: map[string]int{}}
			cfg := Config{Net: n, DHCP: d, LinkTimeout: 200 * time.Millisecond, DHCPTimeout: time.Second, DHCPAttempts: 3}
			leases, err := ConfigureNetwork(t.Context(), slog.New(slog.DiscardHandler), cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v", err)
				}
				if d.calls["eth0"] != 3 {
					t.Fatalf("eth0 tried %d times, want 3", d.calls["eth0"])
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(leases) != len(tc.wantAddrs) || strings.Join(n.addrs, ",") != strings.Join(tc.wantAddrs, ",") ||
				strings.Join(n.routes, ",") != strings.Join(tc.wantRoute, ",") {
				t.Fatalf("leases %v addrs %v routes %v", leases, n.addrs, n.routes)
			}
		})
	}
}

func TestStart(t *testing.T) {
	sysfs := fstest.MapFS{"class/dmi/id/product_uuid": {Data: []byte("4c4c4544-0000\n")}}
	for _, mode := range []Mode{ModeJoin, ModeDiscovery} {
		t.Run(string(mode), func(t *testing.T) {
			line := "bcd.gateway=https://10.0.2.2:8443/ bcd.mode=discovery"
			if mode == ModeJoin {
				line = "bcd.gateway=https://10.0.2.2:8443/ bcd.token=" + tok + " bcd.ca=" + EncodeCA(testCA(t))
			}
			var console, logs bytes.Buffer
			s, err := Start(t.Context(), &console, slog.New(slog.NewTextHandler(&logs, nil)), Config{
				Cmdline:    func() (string, error) { return line, nil },
				Net:        twoNICs(),
				DHCP:       &fakeDHCP{fails: map[string]int{"eth0": 1}, calls: map[string]int{}},
				SysFS:      sysfs,
				RetryDelay: time.Millisecond,
			})
			if err != nil {
				t.Fatal(err)
			}
			if s.Params.Mode != mode || s.Hints.SystemUUID != "4c4c4544-0000" || len(s.Hints.MACs) != 2 || len(s.Leases) != 2 {
				t.Fatalf("session %+v", s)
			}
			out := console.String()
			if !strings.Contains(out, MarkerReady+" ip=eth0:10.0.2.14/24,eth1:10.0.2.99/24 gateway=https://10.0.2.2:8443/ mode="+string(mode)) {
				t.Fatalf("console:\n%s", out)
			}
			if strings.Contains(out+logs.String(), tok) {
				t.Fatal("token on the console or in the logs")
			}
		})
	}
}

func TestStartBadCmdlineIsFatal(t *testing.T) {
	_, err := Start(t.Context(), &bytes.Buffer{}, slog.New(slog.DiscardHandler), Config{
		Cmdline: func() (string, error) { return "console=ttyS0", nil }, Net: twoNICs(), DHCP: &fakeDHCP{},
	})
	if err == nil || !strings.Contains(err.Error(), "bcd.gateway is missing") {
		t.Fatalf("err = %v", err)
	}
}

func TestStartRetriesNetworkUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	var console bytes.Buffer
	_, err := Start(ctx, &console, slog.New(slog.DiscardHandler), Config{
		Cmdline: func() (string, error) { return "bcd.gateway=http://h/ bcd.mode=discovery", nil },
		Net:     &fakeNet{nics: []NIC{{Name: "eth0", Index: 2, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}}, carrier: map[string]bool{}},
		DHCP:    &fakeDHCP{}, LinkTimeout: 20 * time.Millisecond, RetryDelay: 10 * time.Millisecond,
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v", err)
	}
	if strings.Count(console.String(), "network not up yet") < 2 {
		t.Fatalf("console:\n%s", console.String())
	}
}
