package dhcp

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// observed records the bindings a server passes on.
type observed struct {
	mu sync.Mutex
	bs []Binding
}

func (o *observed) add(b Binding) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.bs = append(o.bs, b)
}

func (o *observed) take() []Binding {
	o.mu.Lock()
	defer o.mu.Unlock()
	bs := o.bs
	o.bs = nil
	return bs
}

func sameBindings(got, want []Binding) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.MAC.String() != w.MAC.String() || g.IP != w.IP || !g.Expires.Equal(w.Expires) || g.Released != w.Released {
			return false
		}
	}
	return true
}

// TestProxyModeObservesRequestedAddresses: in proxy mode the server learns, from every
// REQUEST and INFORM it sees (whichever server they name, netboot client or not), the address
// the client takes; a DISCOVER, or a request naming no usable address, teaches nothing.
func TestProxyModeObservesRequestedAddresses(t *testing.T) {
	ctx := context.Background()
	var o observed
	s, err := New(ctx, Config{Mode: ModeProxy, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base,
		Boot: Policy{EFIBinary: BinaryEFI}, Observe: o.add})
	if err != nil {
		t.Fatal(err)
	}
	siteDHCP := net.IPv4(10, 0, 0, 2) // the site's own DHCP server
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	cases := []struct {
		name string
		l    Listener
		pkt  *dhcpv4.DHCPv4
		want []Binding
	}{
		{"iPXE selecting its offer from the site's server", ListenerDHCP,
			request(t, macA, append(ipxeEFI.mods(), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 77))),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(siteDHCP)))...),
			[]Binding{{MAC: macA, IP: ip("10.0.0.77")}}},
		{"an installed OS (no PXE vendor class) rebooting", ListenerDHCP,
			request(t, macB, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 78)))),
			[]Binding{{MAC: macB, IP: ip("10.0.0.78")}}},
		{"the PXE request to port 4011 carries ciaddr", ListenerPXE,
			request(t, macA, append(efiPXE.mods(), dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 79)))...),
			[]Binding{{MAC: macA, IP: ip("10.0.0.79")}}},
		{"an INFORM carries ciaddr", ListenerPXE,
			mustNew(t, dhcpv4.WithHwAddr(macB), dhcpv4.WithMessageType(dhcpv4.MessageTypeInform), dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 80))),
			[]Binding{{MAC: macB, IP: ip("10.0.0.80")}}},
		{"a DISCOVER names no address", ListenerDHCP, discover(t, macA, ipxeEFI.mods()...), nil},
		{"a REQUEST with neither option 50 nor ciaddr", ListenerDHCP, request(t, macA, ipxeEFI.mods()...), nil},
		{"a broadcast address is not a client's", ListenerDHCP,
			request(t, macA, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(255, 255, 255, 255)))), nil},
		{"nor is a multicast one", ListenerDHCP,
			request(t, macA, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(224, 0, 0, 1)))), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s.Handle(ctx, tc.l, tc.pkt)
			if got := o.take(); !sameBindings(got, tc.want) {
				t.Fatalf("observed %+v, want %+v", got, tc.want)
			}
		})
	}
}

func mustNew(t *testing.T, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
	t.Helper()
	d, err := dhcpv4.New(mods...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestFullModeObservesLeases: in full mode a binding is a lease granted (with its expiry) or
// given back, and a restarted server passes on the unexpired leases it loaded. Offers, NAKs and
// REQUESTs for another server bind nothing.
func TestFullModeObservesLeases(t *testing.T) {
	ctx := context.Background()
	clk := &clock{t0}
	store := NewFileLeaseStore(filepath.Join(t.TempDir(), "leases.json"))
	var o observed
	cfg := Config{Mode: ModeFull, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI},
		Pools: pools(), Leases: store, Now: clk.now, Observe: o.add}
	s, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := o.take(); len(got) != 0 {
		t.Fatalf("a server with no leases observed %+v", got)
	}
	offer := s.Handle(ctx, ListenerDHCP, discover(t, macA))
	if got := o.take(); offer == nil || len(got) != 0 {
		t.Fatalf("an offer bound %+v", got)
	}
	ours := dhcpv4.WithOption(dhcpv4.OptServerIdentifier(serverIP.AsSlice()))
	s.Handle(ctx, ListenerDHCP, request(t, macA, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)), ours))
	expires := t0.Add(2 * time.Hour) // the pool's lease time
	want := []Binding{{MAC: macA, IP: netip.MustParseAddr("10.0.0.100"), Expires: expires}}
	if got := o.take(); !sameBindings(got, want) {
		t.Fatalf("ACK observed %+v, want %+v", got, want)
	}
	// NAKed (another's address) and another server's REQUEST: nothing.
	s.Handle(ctx, ListenerDHCP, request(t, macB, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 100))), ours))
	s.Handle(ctx, ListenerDHCP, request(t, macB, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 101))),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 0, 2)))))
	if got := o.take(); len(got) != 0 {
		t.Fatalf("a NAK or another server's REQUEST bound %+v", got)
	}
	// A second client, then a restart an hour later: both leases come back, unexpired.
	offer = s.Handle(ctx, ListenerDHCP, discover(t, macB))
	s.Handle(ctx, ListenerDHCP, request(t, macB, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)), ours))
	o.take()
	clk.t = t0.Add(time.Hour)
	if _, err := New(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	got := o.take()
	if len(got) != 2 {
		t.Fatalf("restart observed %+v, want both leases", got)
	}
	for _, b := range got {
		if b.Released || !b.Expires.After(clk.t) || (b.MAC.String() == macA.String()) != (b.IP == netip.MustParseAddr("10.0.0.100")) {
			t.Fatalf("restart observed %+v", b)
		}
	}
	// A restart after both expired passes on nothing.
	clk.t = t0.Add(5 * time.Hour)
	if _, err := New(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if got := o.take(); len(got) != 0 {
		t.Fatalf("expired leases observed at restart: %+v", got)
	}
	// RELEASE and DECLINE unbind.
	clk.t = t0.Add(time.Hour)
	rel := mustNew(t, dhcpv4.WithHwAddr(macA), dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 100)))
	dec := mustNew(t, dhcpv4.WithHwAddr(macB), dhcpv4.WithMessageType(dhcpv4.MessageTypeDecline), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 101))))
	s.Handle(ctx, ListenerDHCP, rel)
	s.Handle(ctx, ListenerDHCP, dec)
	want = []Binding{{MAC: macA, IP: netip.MustParseAddr("10.0.0.100"), Released: true}, {MAC: macB, IP: netip.MustParseAddr("10.0.0.101"), Released: true}}
	if got := o.take(); !sameBindings(got, want) {
		t.Fatalf("release/decline observed %+v, want %+v", got, want)
	}
}

// TestKnownLeasesMerge: leases another agent of the site granted (Config.Known) are merged with
// the lease file at start, the longer-running lease winning per MAC and per address; they are
// saved, passed on as bindings, and never offered to another client.
func TestKnownLeasesMerge(t *testing.T) {
	ctx := context.Background()
	mac := func(b byte) net.HardwareAddr { return net.HardwareAddr{0x52, 0x54, 0, 0, 1, b} }
	ip := netip.MustParseAddr
	l := func(m byte, addr string, d time.Duration) Lease {
		return Lease{MAC: mac(m).String(), IP: ip(addr), Expires: t0.Add(d)}
	}
	store := &memLeases{leases: []Lease{l(0xa, "10.0.0.100", time.Hour), l(0xb, "10.0.0.101", time.Hour)}}
	known := []Lease{
		l(0xc, "10.0.0.100", 2*time.Hour),    // runs longer than A's lease of the same address: wins
		l(0xb, "10.0.0.102", 30*time.Minute), // B's own lease runs longer: kept
		l(0xd, "10.9.1.10", time.Hour),       // new
		l(0xe, "10.9.1.11", -time.Minute),    // ended
		l(0xf, "192.168.0.5", time.Hour),     // in no pool
	}
	var o observed
	s, err := New(ctx, Config{Mode: ModeFull, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI},
		Pools: pools(), Leases: store, Known: known, Now: (&clock{t0}).now, Observe: o.add})
	if err != nil {
		t.Fatal(err)
	}
	want := []Lease{l(0xc, "10.0.0.100", 2*time.Hour), l(0xb, "10.0.0.101", time.Hour), l(0xd, "10.9.1.10", time.Hour)}
	if got := s.Leases(); !slices.Equal(got, want) {
		t.Fatalf("merged leases %+v\nwant %+v", got, want)
	}
	store.mu.Lock()
	saved := slices.Clone(store.leases)
	store.mu.Unlock()
	if !slices.Equal(saved, want) {
		t.Fatalf("saved %+v, want the merged leases", saved)
	}
	if got := o.take(); len(got) != 3 {
		t.Fatalf("bindings at start %+v, want the 3 merged leases", got)
	}
	// A new client gets neither C's nor D's address.
	if offer := s.Handle(ctx, ListenerDHCP, discover(t, mac(0x1))); offer == nil || offer.YourIPAddr.String() != "10.0.0.102" {
		t.Fatalf("offer %v, want 10.0.0.102", offer)
	}
	relayed := discover(t, mac(0x2), dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1)))
	if offer := s.Handle(ctx, ListenerDHCP, relayed); offer == nil || offer.YourIPAddr.String() != "10.9.1.11" {
		t.Fatalf("relayed offer %v, want 10.9.1.11", offer)
	}
	// Nothing known: nothing saved at start.
	quiet := &memLeases{leases: []Lease{l(0xa, "10.0.0.100", time.Hour)}}
	if _, err := New(ctx, Config{Mode: ModeFull, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI},
		Pools: pools(), Leases: quiet, Now: (&clock{t0}).now}); err != nil || quiet.saves != 0 {
		t.Fatalf("a start with nothing known saved %d times (%v)", quiet.saves, err)
	}
}

// TestObserveModeAnswersNothing: observe mode learns what proxy mode learns and never answers,
// whatever it sees; it needs an observer.
func TestObserveModeAnswersNothing(t *testing.T) {
	ctx := context.Background()
	if _, err := New(ctx, Config{Mode: ModeObserve, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI}}); err == nil {
		t.Fatal("observe mode without an observer accepted")
	}
	var o observed
	s, err := New(ctx, Config{Mode: ModeObserve, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base,
		Boot: Policy{EFIBinary: BinaryEFI}, Observe: o.add})
	if err != nil {
		t.Fatal(err)
	}
	pkts := []*dhcpv4.DHCPv4{
		discover(t, macA, ipxeEFI.mods()...),
		discover(t, macA, efiPXE.mods()...),
		request(t, macA, append(ipxeEFI.mods(), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 77))),
			dhcpv4.WithOption(dhcpv4.OptServerIdentifier(serverIP.AsSlice())))...), // even one naming us
		mustNew(t, dhcpv4.WithHwAddr(macB), dhcpv4.WithMessageType(dhcpv4.MessageTypeInform), dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 80))),
	}
	for _, p := range pkts {
		for _, l := range []Listener{ListenerDHCP, ListenerPXE} {
			if r := s.Handle(ctx, l, p); r != nil {
				t.Fatalf("observe mode answered %s with %s", p.MessageType(), r.MessageType())
			}
		}
	}
	want := []Binding{{MAC: macA, IP: netip.MustParseAddr("10.0.0.77")}, {MAC: macB, IP: netip.MustParseAddr("10.0.0.80")}}
	if got := o.take(); !sameBindings(got, want) {
		t.Fatalf("observed %+v, want %+v", got, want)
	}
	if c := s.Counters(); c.Offers.Load()+c.Acks.Load()+c.Naks.Load() != 0 {
		t.Fatal("observe mode counted replies")
	}
}
