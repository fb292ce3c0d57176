package dhcp

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

const base = "http://10.0.0.1:8080"

var (
	serverIP = netip.MustParseAddr("10.0.0.1")
	macA     = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0a}
	macB     = net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0b}
	guid     = append([]byte{0}, bytes.Repeat([]byte{0x11}, 16)...)
)

// client is one firmware class: the options it puts in its packets.
type client struct {
	name   string
	arch   *iana.Arch
	vendor string
	user   string
}

func archp(a iana.Arch) *iana.Arch { return &a }

func (c client) mods() []dhcpv4.Modifier {
	var m []dhcpv4.Modifier
	if c.arch != nil {
		m = append(m, dhcpv4.WithOption(dhcpv4.OptClientArch(*c.arch)))
	}
	if c.vendor != "" {
		m = append(m, dhcpv4.WithOption(dhcpv4.OptClassIdentifier(c.vendor)))
	}
	if c.user != "" {
		m = append(m, dhcpv4.WithUserClass(c.user, false))
	}
	return append(m, dhcpv4.WithOption(dhcpv4.OptGeneric(dhcpv4.OptionClientMachineIdentifier, guid)))
}

var (
	biosPXE   = client{"bios pxe", archp(iana.INTEL_X86PC), "PXEClient:Arch:00000:UNDI:002001", ""}
	efiPXE    = client{"efi x64 pxe", archp(iana.EFI_BC), "PXEClient:Arch:00007:UNDI:003016", ""}
	efi9PXE   = client{"efi x64 (9) pxe", archp(iana.EFI_X86_64), "PXEClient:Arch:00009:UNDI:003016", ""}
	arm64PXE  = client{"arm64 pxe", archp(iana.EFI_ARM64), "PXEClient:Arch:00011:UNDI:003000", ""}
	efiHTTP   = client{"efi x64 http", archp(iana.EFI_X86_64_HTTP), "HTTPClient:Arch:00016:UNDI:003001", ""}
	arm64HTTP = client{"arm64 http", archp(iana.EFI_ARM64_HTTP), "HTTPClient:Arch:00019:UNDI:003001", ""}
	ipxeEFI   = client{"ipxe efi", archp(iana.EFI_BC), "PXEClient:Arch:00007:UNDI:003010", "iPXE"}
	ipxeBIOS  = client{"ipxe bios", archp(iana.INTEL_X86PC), "PXEClient:Arch:00000:UNDI:002001", "iPXE"}
	ia32PXE   = client{"ia32 pxe", archp(iana.EFI_IA32), "PXEClient:Arch:00006:UNDI:003016", ""}
	plain     = client{"plain", nil, "", ""}
)

// FirmwareClients lists every class the DHCP side distinguishes (the contract test uses it too).
func allClients() []client {
	return []client{biosPXE, efiPXE, efi9PXE, arm64PXE, efiHTTP, arm64HTTP, ipxeEFI, ipxeBIOS, ia32PXE, plain}
}

type expect struct {
	file   string // "" → no boot file
	siaddr string
	vendor string
	opt43  bool
	noPXE  bool // option 175 with iPXE's no-pxedhcp (full mode's answers to iPXE)
}

var scriptURL = base + "/boot.ipxe?mac=${net0/mac}&uuid=${uuid}&arch=${buildarch}"

func expectations(haveARM64 bool) map[string]*expect {
	m := map[string]*expect{
		"bios pxe":        {file: "undionly.kpxe", siaddr: "10.0.0.1", vendor: "PXEClient", opt43: true},
		"efi x64 pxe":     {file: "ipxe.efi", siaddr: "10.0.0.1", vendor: "PXEClient", opt43: true},
		"efi x64 (9) pxe": {file: "ipxe.efi", siaddr: "10.0.0.1", vendor: "PXEClient", opt43: true},
		"arm64 pxe":       nil,
		"efi x64 http":    {file: base + "/ipxe/ipxe.efi", siaddr: "0.0.0.0", vendor: "HTTPClient"},
		"arm64 http":      nil,
		"ipxe efi":        {file: scriptURL, siaddr: "0.0.0.0", vendor: "PXEClient"},
		"ipxe bios":       {file: scriptURL, siaddr: "0.0.0.0", vendor: "PXEClient"},
		"ia32 pxe":        nil,
		"plain":           nil,
	}
	if haveARM64 {
		m["arm64 pxe"] = &expect{file: "ipxe-arm64.efi", siaddr: "10.0.0.1", vendor: "PXEClient", opt43: true}
		m["arm64 http"] = &expect{file: base + "/ipxe/ipxe-arm64.efi", siaddr: "0.0.0.0", vendor: "HTTPClient"}
	}
	return m
}

func checkBoot(t *testing.T, resp *dhcpv4.DHCPv4, e *expect) {
	t.Helper()
	if e == nil {
		if resp.BootFileName != "" || resp.ClassIdentifier() != "" || resp.Options.Has(dhcpv4.OptionVendorSpecificInformation) || resp.Options.Has(optionIPXEEncap) {
			t.Fatalf("non-boot client got boot fields: file %q vendor %q", resp.BootFileName, resp.ClassIdentifier())
		}
		return
	}
	if resp.BootFileName != e.file {
		t.Fatalf("file = %q, want %q", resp.BootFileName, e.file)
	}
	if resp.ServerIPAddr.String() != e.siaddr {
		t.Fatalf("siaddr = %s, want %s", resp.ServerIPAddr, e.siaddr)
	}
	if resp.ClassIdentifier() != e.vendor {
		t.Fatalf("option 60 = %q, want %q", resp.ClassIdentifier(), e.vendor)
	}
	if got := resp.GetOneOption(optionIPXEEncap); e.noPXE != (got != nil) || (got != nil && !bytes.Equal(got, []byte{176, 1, 1})) {
		t.Fatalf("option 175 = %v, want no-pxedhcp=%v", got, e.noPXE)
	}
	if got := resp.GetOneOption(dhcpv4.OptionVendorSpecificInformation); e.opt43 != (got != nil) || (got != nil && !bytes.Equal(got, []byte{6, 1, 8, 255})) {
		t.Fatalf("option 43 = %v, want present=%v", got, e.opt43)
	}
}

type memLeases struct {
	mu     sync.Mutex
	leases []Lease
	saves  int
	fail   error
}

func (m *memLeases) LoadLeases(context.Context) ([]Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Lease(nil), m.leases...), nil
}

func (m *memLeases) SaveLeases(_ context.Context, l []Lease) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.leases = append([]Lease(nil), l...)
	m.saves++
	return nil
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

var t0 = time.Date(2026, 5, 1, 8, 0, 0, 0, time.UTC)

func pools() []Pool {
	return []Pool{
		{
			Subnet: netip.MustParsePrefix("10.0.0.0/24"), Start: netip.MustParseAddr("10.0.0.100"), End: netip.MustParseAddr("10.0.0.102"),
			Routers: []netip.Addr{netip.MustParseAddr("10.0.0.254")}, DNS: []netip.Addr{netip.MustParseAddr("10.0.0.53")}, Domain: "prov.example", LeaseTime: 2 * time.Hour,
		},
		{
			Subnet: netip.MustParsePrefix("10.9.0.0/16"), Start: netip.MustParseAddr("10.9.1.10"), End: netip.MustParseAddr("10.9.1.20"),
			Routers: []netip.Addr{netip.MustParseAddr("10.9.0.1")},
		},
	}
}

func newProxy(t *testing.T, p Policy) *Server {
	t.Helper()
	s, err := New(context.Background(), Config{Mode: ModeProxy, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: p})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newFull(t *testing.T, store LeaseStore, c *clock, res ...Reservation) *Server {
	t.Helper()
	s, err := New(context.Background(), Config{
		Mode: ModeFull, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI},
		Pools: pools(), Reservations: res, Leases: store, Now: c.now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func discover(t *testing.T, mac net.HardwareAddr, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	d, err := dhcpv4.NewDiscovery(mac, mods...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func request(t *testing.T, mac net.HardwareAddr, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	d, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithHwAddr(mac), dhcpv4.WithMessageType(dhcpv4.MessageTypeRequest)}, mods...)...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestProxyModeEveryFirmware(t *testing.T) {
	for _, arm := range []bool{false, true} {
		s := newProxy(t, Policy{EFIBinary: BinaryEFI, HaveARM64: arm})
		exp := expectations(arm)
		for _, c := range allClients() {
			t.Run(c.name, func(t *testing.T) {
				e := exp[c.name]
				// DISCOVER on 67 → OFFER without an address.
				offer := s.Handle(context.Background(), ListenerDHCP, discover(t, macA, c.mods()...))
				if e == nil {
					if offer != nil {
						t.Fatalf("proxy answered a client it cannot boot: %v", offer.Summary())
					}
					return
				}
				if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer {
					t.Fatalf("no offer")
				}
				if !offer.YourIPAddr.IsUnspecified() || offer.Options.Has(dhcpv4.OptionIPAddressLeaseTime) {
					t.Fatalf("proxy offered an address: %s", offer.YourIPAddr)
				}
				if !offer.ServerIdentifier().Equal(serverIP.AsSlice()) {
					t.Fatalf("server id %s", offer.ServerIdentifier())
				}
				if !bytes.Equal(offer.GetOneOption(dhcpv4.OptionClientMachineIdentifier), guid) {
					t.Fatal("option 97 not echoed")
				}
				checkBoot(t, offer, e)
				// REQUEST on 4011 → ACK with the same boot fields.
				req := request(t, macA, append(c.mods(), dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 77)))...)
				ack := s.Handle(context.Background(), ListenerPXE, req)
				if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
					t.Fatalf("no ACK on 4011")
				}
				checkBoot(t, ack, e)
				// A REQUEST on 67 for the site's real DHCP server is not ours.
				other := request(t, macA, append(c.mods(), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 0, 2))))...)
				if r := s.Handle(context.Background(), ListenerDHCP, other); r != nil {
					t.Fatalf("answered a REQUEST for another server: %s", r.MessageType())
				}
			})
		}
	}
	s := newProxy(t, Policy{EFIBinary: BinarySNPOnly})
	offer := s.Handle(context.Background(), ListenerDHCP, discover(t, macA, efiPXE.mods()...))
	if offer == nil || offer.BootFileName != "snponly.efi" {
		t.Fatalf("snponly policy: %v", offer)
	}
}

func TestFullModeEveryFirmware(t *testing.T) {
	exp := expectations(false)
	exp["ipxe efi"].noPXE, exp["ipxe bios"].noPXE = true, true
	for _, c := range allClients() {
		t.Run(c.name, func(t *testing.T) {
			store := &memLeases{}
			s := newFull(t, store, &clock{t0})
			offer := s.Handle(context.Background(), ListenerDHCP, discover(t, macA, c.mods()...))
			if offer == nil || offer.MessageType() != dhcpv4.MessageTypeOffer {
				t.Fatal("no offer")
			}
			if offer.YourIPAddr.String() != "10.0.0.100" {
				t.Fatalf("yiaddr %s", offer.YourIPAddr)
			}
			checkBoot(t, offer, exp[c.name])
			req := request(t, macA, append(c.mods(),
				dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(serverIP.AsSlice())))...)
			ack := s.Handle(context.Background(), ListenerDHCP, req)
			if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
				t.Fatal("no ack")
			}
			checkBoot(t, ack, exp[c.name])
			if ack.YourIPAddr.String() != "10.0.0.100" || ack.SubnetMask().String() != "ffffff00" ||
				len(ack.Router()) != 1 || ack.Router()[0].String() != "10.0.0.254" ||
				len(ack.DNS()) != 1 || ack.DNS()[0].String() != "10.0.0.53" || ack.DomainName() != "prov.example" ||
				ack.IPAddressLeaseTime(0) != 2*time.Hour || !ack.ServerIdentifier().Equal(serverIP.AsSlice()) {
				t.Fatalf("ack options: %s", ack.Summary())
			}
			if len(store.leases) != 1 || store.leases[0].MAC != macA.String() || store.leases[0].Expires != t0.Add(2*time.Hour) {
				t.Fatalf("persisted leases: %+v", store.leases)
			}
		})
	}
}

func TestFullModeLeases(t *testing.T) {
	ctx := context.Background()
	clk := &clock{t0}
	store := NewFileLeaseStore(filepath.Join(t.TempDir(), "leases.json"))
	reserved := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0xee}
	res := Reservation{MAC: reserved, IP: netip.MustParseAddr("10.0.0.50")}
	s := newFull(t, store, clk, res)
	bind := func(s *Server, mac net.HardwareAddr, giaddr net.IP) *dhcpv4.DHCPv4 {
		t.Helper()
		mods := []dhcpv4.Modifier{}
		if giaddr != nil {
			mods = append(mods, dhcpv4.WithGatewayIP(giaddr))
		}
		offer := s.Handle(ctx, ListenerDHCP, discover(t, mac, mods...))
		if offer == nil {
			return nil
		}
		ack := s.Handle(ctx, ListenerDHCP, request(t, mac, append(mods,
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)),
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(serverIP.AsSlice())))...))
		if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
			t.Fatalf("offer %s not acknowledged: %v", offer.YourIPAddr, ack)
		}
		return ack
	}
	if a := bind(s, macA, nil); a.YourIPAddr.String() != "10.0.0.100" {
		t.Fatalf("A got %s", a.YourIPAddr)
	}
	if a := bind(s, macB, nil); a.YourIPAddr.String() != "10.0.0.101" {
		t.Fatalf("B got %s", a.YourIPAddr)
	}
	if a := bind(s, reserved, nil); a.YourIPAddr.String() != "10.0.0.50" {
		t.Fatalf("reserved MAC got %s", a.YourIPAddr)
	}

	// Restart: a new server over the same file knows every lease.
	s2 := newFull(t, store, clk, res)
	if got := s2.Leases(); len(got) != 3 {
		t.Fatalf("after restart: %+v", got)
	}
	if a := bind(s2, macB, nil); a.YourIPAddr.String() != "10.0.0.101" {
		t.Fatalf("B after restart got %s", a.YourIPAddr)
	}
	macC := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0c}
	if a := bind(s2, macC, nil); a.YourIPAddr.String() != "10.0.0.102" {
		t.Fatalf("C got %s", a.YourIPAddr)
	}
	// Renewal (ciaddr, no option 50) is acknowledged.
	renew := request(t, macA, dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 100)))
	if r := s2.Handle(ctx, ListenerDHCP, renew); r == nil || r.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("renewal: %v", r)
	}
	// Pool full (3 addresses): D gets nothing.
	macD := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0d}
	if r := s2.Handle(ctx, ListenerDHCP, discover(t, macD)); r != nil {
		t.Fatalf("exhausted pool offered %s", r.YourIPAddr)
	}
	// D asks for A's address: NAK. Asks for one outside the subnet: NAK.
	for _, ip := range []net.IP{net.IPv4(10, 0, 0, 100), net.IPv4(192, 168, 1, 5), net.IPv4(10, 0, 0, 50), net.IPv4(10, 0, 0, 7)} {
		r := s2.Handle(ctx, ListenerDHCP, request(t, macD, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(ip))))
		if r == nil || r.MessageType() != dhcpv4.MessageTypeNak {
			t.Fatalf("D requesting %s: %v", ip, r)
		}
		if r.Options.Has(dhcpv4.OptionIPAddressLeaseTime) || !r.YourIPAddr.IsUnspecified() {
			t.Fatalf("NAK carries lease fields: %s", r.Summary())
		}
	}
	// B releases; D then gets B's address.
	rel, _ := dhcpv4.New(dhcpv4.WithHwAddr(macB), dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 101)))
	if r := s2.Handle(ctx, ListenerDHCP, rel); r != nil {
		t.Fatal("RELEASE answered")
	}
	if a := bind(s2, macD, nil); a.YourIPAddr.String() != "10.0.0.101" {
		t.Fatalf("D after release got %s", a.YourIPAddr)
	}
	// Leases expire: hours later, a new MAC reclaims the oldest expired address.
	clk.t = t0.Add(5 * time.Hour)
	macE := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0e}
	if a := bind(s2, macE, nil); a == nil || !netip.MustParsePrefix("10.0.0.100/30").Contains(netip.AddrFrom4([4]byte(a.YourIPAddr.To4()))) {
		t.Fatalf("E after expiry: %v", a)
	}
	// A REQUEST naming another server is dropped.
	other := request(t, macA, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 100))), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 0, 2))))
	if r := s2.Handle(ctx, ListenerDHCP, other); r != nil {
		t.Fatalf("answered a REQUEST for another server: %v", r.MessageType())
	}
	c := s2.Counters()
	if c.Offers.Load() == 0 || c.Acks.Load() == 0 || c.Naks.Load() != 4 || c.Ignored.Load() < 3 {
		t.Fatalf("counters: offers %d acks %d naks %d ignored %d", c.Offers.Load(), c.Acks.Load(), c.Naks.Load(), c.Ignored.Load())
	}
}

func TestFullModeRelay(t *testing.T) {
	ctx := context.Background()
	s := newFull(t, &memLeases{}, &clock{t0})
	relay := net.IPv4(10, 9, 0, 1)
	d := discover(t, macA, append(efiPXE.mods(), dhcpv4.WithGatewayIP(relay))...)
	offer := s.Handle(ctx, ListenerDHCP, d)
	if offer == nil || offer.YourIPAddr.String() != "10.9.1.10" {
		t.Fatalf("relayed offer: %v", offer)
	}
	if !offer.GatewayIPAddr.Equal(relay) || offer.Router()[0].String() != "10.9.0.1" || offer.SubnetMask().String() != "ffff0000" {
		t.Fatalf("relayed offer fields: %s", offer.Summary())
	}
	checkBoot(t, offer, expectations(false)["efi x64 pxe"])
	dst := ReplyAddr(ListenerDHCP, d, offer, netip.MustParseAddrPort("10.9.0.1:67"), 68, 67, netip.MustParseAddr("255.255.255.255"))
	if dst != netip.MustParseAddrPort("10.9.0.1:67") {
		t.Fatalf("relayed reply goes to %s", dst)
	}
	// A relay from a subnet we have no pool for is ignored.
	unknown := discover(t, macA, dhcpv4.WithGatewayIP(net.IPv4(172, 16, 0, 1)))
	if r := s.Handle(ctx, ListenerDHCP, unknown); r != nil {
		t.Fatalf("answered a relay of an unknown subnet: %v", r.YourIPAddr)
	}
}

func TestReplyAddr(t *testing.T) {
	bcast := netip.MustParseAddr("255.255.255.255")
	mk := func(mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 { d, _ := dhcpv4.New(mods...); return d }
	offer := mk(dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer))
	nak := mk(dhcpv4.WithMessageType(dhcpv4.MessageTypeNak))
	peer := netip.MustParseAddrPort("10.0.0.77:68")
	tests := []struct {
		name      string
		l         Listener
		req, resp *dhcpv4.DHCPv4
		want      string
	}{
		{"pxe port back to source", ListenerPXE, mk(dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 77))), offer, "10.0.0.77:68"},
		{"relayed", ListenerDHCP, mk(dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1))), offer, "10.9.0.1:67"},
		{"relayed nak", ListenerDHCP, mk(dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1))), nak, "10.9.0.1:67"},
		{"nak broadcast", ListenerDHCP, mk(dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 77))), nak, "255.255.255.255:68"},
		{"renewing unicast", ListenerDHCP, mk(dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 77))), offer, "10.0.0.77:68"},
		{"no address broadcast", ListenerDHCP, mk(), offer, "255.255.255.255:68"},
	}
	for _, tt := range tests {
		if got := ReplyAddr(tt.l, tt.req, tt.resp, peer, 68, 67, bcast); got.String() != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	good := Config{Mode: ModeFull, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI}, Pools: pools(), Leases: &memLeases{}}
	tests := map[string]func(*Config){
		"unknown mode":   func(c *Config) { c.Mode = "dhcp" },
		"no server ip":   func(c *Config) { c.ServerIP = netip.Addr{} },
		"v6 server ip":   func(c *Config) { c.ServerIP = netip.MustParseAddr("fd00::1") },
		"bad policy":     func(c *Config) { c.Boot.EFIBinary = "x.efi" },
		"https base":     func(c *Config) { c.HTTPBaseURL = "https://x" },
		"trailing slash": func(c *Config) { c.HTTPBaseURL = base + "/" },
		"no interface":   func(c *Config) { c.Interface = "" },
		"no pools":       func(c *Config) { c.Pools = nil },
		"no lease store": func(c *Config) { c.Leases = nil },
		"range outside": func(c *Config) {
			c.Pools = []Pool{{Subnet: netip.MustParsePrefix("10.0.0.0/24"), Start: netip.MustParseAddr("10.0.1.1"), End: netip.MustParseAddr("10.0.1.5")}}
		},
		"range reversed": func(c *Config) {
			c.Pools = []Pool{{Subnet: netip.MustParsePrefix("10.0.0.0/24"), Start: netip.MustParseAddr("10.0.0.9"), End: netip.MustParseAddr("10.0.0.5")}}
		},
		"reservation away": func(c *Config) { c.Reservations = []Reservation{{MAC: macA, IP: netip.MustParseAddr("192.168.0.1")}} },
		"reservation dup": func(c *Config) {
			c.Reservations = []Reservation{{MAC: macA, IP: netip.MustParseAddr("10.0.0.5")}, {MAC: macB, IP: netip.MustParseAddr("10.0.0.5")}}
		},
	}
	for name, mod := range tests {
		c := good
		mod(&c)
		if _, err := New(context.Background(), c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := New(context.Background(), good); err != nil {
		t.Fatalf("good config refused: %v", err)
	}
	off, err := New(context.Background(), Config{Mode: ModeOff})
	if err != nil {
		t.Fatal(err)
	}
	if err := off.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestLeaseStoreFailures(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "leases.json")
	fs := NewFileLeaseStore(path)
	if l, err := fs.LoadLeases(ctx); err != nil || l != nil {
		t.Fatalf("missing file: %v %v", l, err)
	}
	want := []Lease{{MAC: macA.String(), IP: netip.MustParseAddr("10.0.0.100"), Expires: t0}}
	if err := fs.SaveLeases(ctx, want); err != nil {
		t.Fatal(err)
	}
	got, err := fs.LoadLeases(ctx)
	if err != nil || len(got) != 1 || got[0].MAC != want[0].MAC || got[0].IP != want[0].IP || !got[0].Expires.Equal(t0) {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("temporary files left: %d entries", len(ents))
	}
	for name, body := range map[string]string{"corrupt": "{not json", "future version": `{"version":2,"leases":[]}`} {
		os.WriteFile(path, []byte(body), 0o600)
		if _, err := fs.LoadLeases(ctx); err == nil {
			t.Errorf("%s file loaded", name)
		}
		if _, err := New(ctx, Config{Mode: ModeFull, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI}, Pools: pools(), Leases: fs}); err == nil {
			t.Errorf("%s file: server started", name)
		}
	}
	// A lease that cannot be persisted is not acknowledged.
	store := &memLeases{fail: errors.New("disk full")}
	s := newFull(t, store, &clock{t0})
	r := s.Handle(ctx, ListenerDHCP, request(t, macA, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 100)))))
	if r != nil {
		t.Fatalf("unpersisted lease answered with %s", r.MessageType())
	}
}
