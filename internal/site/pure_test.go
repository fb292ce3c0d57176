package site

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"bcd/internal/agentlink"
	"bcd/internal/bmc"
	"bcd/internal/netboot"
)

func TestBaseURL(t *testing.T) {
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	tests := []struct {
		explicit string
		ln       net.Addr
		ip       string
		want     string
		err      string
	}{
		{"http://boot.example:8080", tcp("0.0.0.0:8080"), "", "http://boot.example:8080", ""},
		{"", tcp("127.0.0.1:4000"), "", "http://127.0.0.1:4000", ""},
		{"", tcp("0.0.0.0:8080"), "10.0.0.1", "http://10.0.0.1:8080", ""},
		{"", tcp("[::]:8080"), "10.0.0.1", "http://10.0.0.1:8080", ""},
		{"", tcp("0.0.0.0:8080"), "", "", "--http-url"},
		{"", tcp("[fd00::1]:80"), "", "http://[fd00::1]:80", ""},
	}
	for _, tc := range tests {
		var ip netip.Addr
		if tc.ip != "" {
			ip = netip.MustParseAddr(tc.ip)
		}
		got, err := BaseURL(tc.explicit, tc.ln, ip)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("BaseURL(%q, %s, %q) error %v, want %q", tc.explicit, tc.ln, tc.ip, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("BaseURL(%q, %s, %q) = %q, %v; want %q", tc.explicit, tc.ln, tc.ip, got, err, tc.want)
		}
	}
}

func TestCanonicalMACs(t *testing.T) {
	tests := []struct {
		in   []string
		want []string
		err  string
	}{
		{[]string{"52:54:00:AA:BB:CC"}, []string{"52:54:00:aa:bb:cc"}, ""},
		{[]string{"52-54-00-aa-bb-cc", "52:54:00:aa:bb:cc", "52:54:00:aa:bb:cd"}, []string{"52:54:00:aa:bb:cc", "52:54:00:aa:bb:cd"}, ""},
		{nil, nil, "macs is empty"},
		{[]string{"52:54:00:aa:bb"}, nil, "mac 0"},
		{[]string{"52:54:00:aa:bb:cc", "zz:54:00:aa:bb:cc"}, nil, "mac 1"},
	}
	for _, tc := range tests {
		got, err := canonicalMACs(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%v = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestBootOptions(t *testing.T) {
	tests := []struct {
		args commandArgs
		dev  bmc.BootDevice
		opts bmc.BootOptions
		err  string
	}{
		{commandArgs{Device: "pxe"}, bmc.BootPXE, bmc.BootOptions{}, ""},
		{commandArgs{Device: "disk", Persistent: true, Mode: "uefi"}, bmc.BootDisk, bmc.BootOptions{Persistent: true, Mode: bmc.BootModeUEFI}, ""},
		{commandArgs{Device: "cd", Mode: "legacy"}, bmc.BootCD, bmc.BootOptions{Mode: bmc.BootModeLegacy}, ""},
		{commandArgs{Device: "floppy"}, "", bmc.BootOptions{}, "unknown boot device"},
		{commandArgs{Device: "pxe", Mode: "efi"}, "", bmc.BootOptions{}, "boot mode"},
	}
	for _, tc := range tests {
		dev, opts, err := bootOptions(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%+v: error %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || dev != tc.dev || opts != tc.opts {
			t.Errorf("%+v = %s %+v %v", tc.args, dev, opts, err)
		}
	}
}

func TestDecodeArgs(t *testing.T) {
	tests := []struct {
		cmd      agentlink.Command
		wantNode string
		persist  bool
		err      string
	}{
		{agentlink.Command{NodeID: "n1", Args: []byte(`{"nodeId":"n1","persistent":"true"}`)}, "n1", true, ""},
		{agentlink.Command{NodeID: "n1", Args: []byte(`{"persistent":true}`)}, "n1", true, ""},
		{agentlink.Command{Args: []byte(`{"nodeId":"n2","persistent":"false"}`)}, "n2", false, ""},
		{agentlink.Command{Args: []byte(`{}`)}, "", false, "nodeId is missing"},
		{agentlink.Command{NodeID: "n1", Args: []byte(`{"nodeId":"n2"}`)}, "", false, "command is for node n1"},
		{agentlink.Command{NodeID: "n1", Args: []byte(`{"macs":"bcdd_secret-token"}`)}, "", false, "field macs has the wrong type"},
		{agentlink.Command{NodeID: "n1", Args: []byte(`{"persistent":"maybe"}`)}, "", false, "expected shape"},
		{agentlink.Command{NodeID: "n1", Args: []byte(`not json bcdd_secret-token`)}, "", false, "not a JSON object"},
	}
	for _, tc := range tests {
		a, err := decodeArgs(tc.cmd)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "secret-token") {
				t.Errorf("%s: error %v, want %q and no argument quoted", tc.cmd.Args, err, tc.err)
			}
			continue
		}
		if err != nil || a.NodeID != tc.wantNode || bool(a.Persistent) != tc.persist {
			t.Errorf("%s = %+v, %v", tc.cmd.Args, a, err)
		}
	}
}

func TestEntries(t *testing.T) {
	art := func(n string) netboot.Artifact {
		return netboot.Artifact{Name: n, URL: "http://origin/" + n, SHA256: strings.Repeat("a", 63) + string(rune('0'+len(n)%10))}
	}
	r := RamdiskConfig{Kernel: art("vmlinuz"), Initrd: art("initrd.img"), GatewayURL: "https://gw:8443"}
	if _, err := RamdiskEntry(RamdiskConfig{}, "tok"); err == nil || !strings.Contains(err.Error(), "--ramdisk-kernel") {
		t.Fatalf("unconfigured ramdisk: %v", err)
	}
	if _, err := RamdiskEntry(r, "short"); err == nil || strings.Contains(err.Error(), "short") {
		t.Fatalf("bad token: %v (must fail without echoing it)", err)
	}
	ram, err := RamdiskEntry(r, "bcdd_0123456789abcdef")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, def, want string }{{"", "", "exit"}, {"", "sanboot", "sanboot"}, {"exit", "sanboot", "exit"}} {
		e, err := LocalEntry(tc.method, tc.def)
		if err != nil || string(e.Local) != tc.want {
			t.Errorf("LocalEntry(%q, %q) = %v, %v; want %s", tc.method, tc.def, e.Local, err, tc.want)
		}
	}
	if _, err := LocalEntry("grub", ""); err == nil {
		t.Error("LocalEntry accepted grub")
	}

	dir := t.TempDir()
	e, err := OpenEntries(dir, "https://gw:8443", []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"))
	if err != nil {
		t.Fatal(err)
	}
	macs := []string{"52:54:00:00:00:01", "52:54:00:00:00:02"}
	if err := e.Install("n1", macs, ram); err != nil {
		t.Fatal(err)
	}
	if err := e.SetInstance("n1", macs[:1], "bcdi_instance-token-0123", nil); err != nil {
		t.Fatal(err)
	}
	if err := e.Install("n2", []string{"52:54:00:00:00:03"}, ram); err != nil {
		t.Fatal(err)
	}
	if err := e.Install("n1", macs, netboot.Entry{Kind: netboot.KindRamdisk}); err == nil {
		t.Fatal("an invalid entry was installed")
	}
	fi, err := os.Stat(filepath.Join(dir, EntriesFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("entries file: %v %v", fi, err)
	}
	// Reopened: everything is back.
	e2, err := OpenEntries(dir, "https://gw:8443", []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"))
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC(macs[1])
	got, ok := e2.Entry(context.Background(), mac)
	if !ok || got.Token != ram.Token || got.Kernel != ram.Kernel || e2.Len() != 3 {
		t.Fatalf("reopened: %+v %t len %d", got, ok, e2.Len())
	}
	addr := netip.MustParseAddr("10.0.0.7")
	if _, ok := e2.Metadata(context.Background(), addr); ok {
		t.Fatal("metadata for an address never seen")
	}
	e2.Learn(addr, macs[0])
	doc, ok := e2.Metadata(context.Background(), netip.MustParseAddr("::ffff:10.0.0.7"))
	if !ok || !strings.Contains(string(doc), `"instanceToken":"bcdi_instance-token-0123"`) || !strings.Contains(string(doc), `"nodeId":"n1"`) ||
		!strings.Contains(string(doc), `"ca":"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"`) {
		t.Fatalf("metadata %s %t", doc, ok)
	}
	// Remove drops every entry of the node, even a MAC the command did not name.
	gen := e2.Generation()
	if err := e2.Remove("n1", macs[:1]); err != nil {
		t.Fatal(err)
	}
	if e2.Has(macs[0]) || e2.Has(macs[1]) || !e2.Has("52:54:00:00:00:03") || e2.Generation() == gen {
		t.Fatal("Remove did not remove exactly n1's entries")
	}
	// A failed save leaves memory as the disk has it.
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o700)
	if os.Geteuid() != 0 { // root ignores directory permissions
		if err := e2.Install("n3", []string{"52:54:00:00:00:09"}, ram); err == nil {
			t.Fatal("install succeeded in a read-only dir")
		}
		if e2.Has("52:54:00:00:00:09") {
			t.Fatal("a failed install is visible")
		}
	}
}

// fakeDriver implements some capabilities.
type fakePower struct {
	state  bmc.PowerState
	closed *int
}

func (f *fakePower) GetPower(context.Context) (bmc.PowerState, error) { return f.state, nil }
func (f *fakePower) Close(context.Context) error                      { *f.closed++; return nil }

func TestWithDriver(t *testing.T) {
	closed := 0
	reg := map[string]DriverFactory{
		"good": func(context.Context, bmc.Endpoint) (any, error) {
			return &fakePower{state: bmc.PowerOn, closed: &closed}, nil
		},
		"down": func(_ context.Context, ep bmc.Endpoint) (any, error) {
			return nil, errors.New("dial tcp: login " + ep.Username + ":" + ep.Password + " refused") // a careless driver
		},
	}
	ep := bmc.Endpoint{Address: "10.0.0.5", Username: "admin", Password: "hunter2-secret"}
	tests := []struct {
		driver, capability string
		err                []string
	}{
		{"good", capGetPower, nil},
		{"good", capSetPower, []string{"power x: driver good at 10.0.0.5: the driver cannot set power"}},
		{"down", capGetPower, []string{"driver down at 10.0.0.5: connecting: dial tcp: login admin:[redacted] refused"}},
		{"nope", capGetPower, []string{`unknown BMC driver "nope": this agent has down, good`}},
	}
	for _, tc := range tests {
		var got bmc.PowerState
		err := withDriver(context.Background(), reg, tc.driver, ep, "power x", tc.capability, func(ctx context.Context, d any) error {
			var err error
			got, err = d.(bmc.PowerGetter).GetPower(ctx)
			return err
		})
		if tc.err == nil {
			if err != nil || got != bmc.PowerOn {
				t.Errorf("%s: %v %v", tc.driver, got, err)
			}
			continue
		}
		if err == nil || strings.Contains(err.Error(), ep.Password) {
			t.Errorf("%s/%s: error %v (must fail, without the password)", tc.driver, tc.capability, err)
			continue
		}
		for _, w := range tc.err {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s/%s: error %q lacks %q", tc.driver, tc.capability, err, w)
			}
		}
	}
	if closed != 2 {
		t.Errorf("drivers closed %d times, want 2 (one per use, supported or not)", closed)
	}
	if s := (Credentials{Username: "u", Password: "p4ss"}).String(); strings.Contains(s, "p4ss") {
		t.Errorf("Credentials.String shows the password: %s", s)
	}
}

func TestBMCLocks(t *testing.T) {
	l := newBMCLocks()
	rel, ok := l.TryLock("k")
	if !ok {
		t.Fatal("free lock not taken")
	}
	if _, ok := l.TryLock("k"); ok {
		t.Fatal("two calls in flight to one BMC")
	}
	if r2, ok := l.TryLock("other"); !ok {
		t.Fatal("BMCs are independent")
	} else {
		r2()
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Lock(ctx, "k"); err == nil {
		t.Fatal("Lock returned while held")
	}
	rel()
	rel() // idempotent
	r3, err := l.Lock(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	r3()
	if len(l.slots) != 0 {
		t.Fatalf("%d slots left", len(l.slots))
	}
}
