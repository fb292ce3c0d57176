package dhcp

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// TestRelayedNakIsBroadcast: a NAK to a relayed REQUEST goes to the relay with the broadcast
// bit set (RFC 2131 §4.3.2), so that the relay broadcasts it on the client's segment: the
// client has no address the relay could unicast it to. A NAK to a client on our segment, and
// every OFFER and ACK, keep the client's own flag.
func TestRelayedNakIsBroadcast(t *testing.T) {
	ctx := context.Background()
	relay := net.IPv4(10, 9, 0, 1)
	tests := []struct {
		name      string
		mods      []dhcpv4.Modifier
		wantType  dhcpv4.MessageType
		wantBcast bool
	}{
		{"relayed NAK, client without the flag", []dhcpv4.Modifier{dhcpv4.WithGatewayIP(relay),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 9, 1, 200)))}, dhcpv4.MessageTypeNak, true},
		{"relayed NAK, address of another subnet", []dhcpv4.Modifier{dhcpv4.WithGatewayIP(relay),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 100)))}, dhcpv4.MessageTypeNak, true},
		{"relayed ACK keeps the client's flag", []dhcpv4.Modifier{dhcpv4.WithGatewayIP(relay),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 9, 1, 10)))}, dhcpv4.MessageTypeAck, false},
		{"direct NAK keeps the client's flag (it is broadcast anyway)", []dhcpv4.Modifier{
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 200)))}, dhcpv4.MessageTypeNak, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newFull(t, &memLeases{}, &clock{t0})
			req := request(t, macA, append(tt.mods, dhcpv4.WithBroadcast(false))...)
			resp := s.Handle(ctx, ListenerDHCP, req)
			if resp == nil || resp.MessageType() != tt.wantType {
				t.Fatalf("reply %v, want %s", resp, tt.wantType)
			}
			if resp.IsBroadcast() != tt.wantBcast {
				t.Fatalf("broadcast flag %v, want %v", resp.IsBroadcast(), tt.wantBcast)
			}
		})
	}
}

// TestNeverOffersServerAddresses: a pool range that covers the site agent's own address, a
// router, a DNS server, or the subnet's network or broadcast address (an easy mistake: a range
// of "the whole /24") never hands them to a client: neither offered nor granted on request.
func TestNeverOffersServerAddresses(t *testing.T) {
	ctx := context.Background()
	ip := netip.MustParseAddr
	pool := Pool{Subnet: netip.MustParsePrefix("10.0.0.0/29"), Start: ip("10.0.0.0"), End: ip("10.0.0.7"),
		Routers: []netip.Addr{ip("10.0.0.6")}, DNS: []netip.Addr{ip("10.0.0.3")}}
	s, err := New(ctx, Config{Mode: ModeFull, Interface: "prov0", ServerIP: ip("10.0.0.1"), HTTPBaseURL: base,
		Boot: Policy{EFIBinary: BinaryEFI}, Pools: []Pool{pool}, Leases: &memLeases{}, Now: (&clock{t0}).now})
	if err != nil {
		t.Fatal(err)
	}
	never := map[netip.Addr]string{ip("10.0.0.0"): "network", ip("10.0.0.1"): "server", ip("10.0.0.3"): "DNS",
		ip("10.0.0.6"): "router", ip("10.0.0.7"): "broadcast"}
	// Requested outright: NAK.
	for a, what := range never {
		r := s.Handle(ctx, ListenerDHCP, request(t, macA, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(a.AsSlice()))))
		if r == nil || r.MessageType() != dhcpv4.MessageTypeNak {
			t.Errorf("REQUEST of the %s address %s: %v, want NAK", what, a, r)
		}
	}
	// Offered: the three others (10.0.0.2, .4, .5), then nothing.
	var got []string
	for i := range 6 {
		mac := net.HardwareAddr{2, 0, 0, 0, 9, byte(i)}
		r := s.Handle(ctx, ListenerDHCP, discover(t, mac))
		if r == nil {
			continue
		}
		a, _ := netip.AddrFromSlice(r.YourIPAddr.To4())
		if what, bad := never[a]; bad {
			t.Errorf("offered the %s address %s", what, a)
		}
		got = append(got, a.String())
	}
	if len(got) != 3 {
		t.Errorf("offers %v, want the 3 usable addresses", got)
	}
	// Leases loaded from the store (or known from the site) on such an address are dropped.
	store := &memLeases{leases: []Lease{{MAC: macB.String(), IP: ip("10.0.0.1"), Expires: t0.Add(1e12)}}}
	s2, err := New(ctx, Config{Mode: ModeFull, Interface: "prov0", ServerIP: ip("10.0.0.1"), HTTPBaseURL: base,
		Boot: Policy{EFIBinary: BinaryEFI}, Pools: []Pool{pool}, Leases: store, Now: (&clock{t0}).now})
	if err != nil {
		t.Fatal(err)
	}
	if l := s2.Leases(); len(l) != 0 {
		t.Errorf("kept a lease of the server's address: %+v", l)
	}
	// A reservation of one of them is a configuration error.
	_, err = New(ctx, Config{Mode: ModeFull, Interface: "prov0", ServerIP: ip("10.0.0.1"), HTTPBaseURL: base,
		Boot: Policy{EFIBinary: BinaryEFI}, Pools: []Pool{pool}, Leases: &memLeases{},
		Reservations: []Reservation{{MAC: macA, IP: ip("10.0.0.6")}}})
	if err == nil {
		t.Error("a reservation of the router's address was accepted")
	}
}

// TestOfferCostStaysFlat: an offer examines a bounded number of addresses, however large the
// pool, both while an address is held back (declined, or answering a probe: after a change of
// boot-lease holder there may be many) and once the pool is exhausted (a flood of DISCOVERs
// from made-up MACs exhausts it in seconds; each further DISCOVER then scanned the whole range
// under the allocator's lock).
func TestOfferCostStaysFlat(t *testing.T) {
	ctx := context.Background()
	ip := netip.MustParseAddr
	const size = 4096
	pool := Pool{Subnet: netip.MustParsePrefix("10.4.0.0/16"), Start: ip("10.4.0.1"), End: ip("10.4.16.0"), LeaseTime: time.Hour}
	a, err := newAllocator(ctx, []Pool{pool}, nil, &memLeases{}, nil, netip.Addr{}, t0)
	if err != nil {
		t.Fatal(err)
	}
	p := &a.pools[0]
	mac := func(i int) string { return net.HardwareAddr{2, 4, 0, 0, byte(i >> 8), byte(i)}.String() }
	// The first address of the range answers a probe: held back for a lease time.
	first, _, _ := a.offer(p, mac(0), t0)
	a.drop(mac(0), first, t0.Add(time.Hour))
	examined := func() uint64 { a.mu.Lock(); defer a.mu.Unlock(); return a.examined }
	before := examined()
	for i := 1; i < size; i++ {
		got, _, ok := a.offer(p, mac(i), t0)
		if !ok || got == first {
			t.Fatalf("offer %d: %s %v", i, got, ok)
		}
		if granted, err := a.request(ctx, p, mac(i), got, t0); err != nil || !granted {
			t.Fatalf("request %d: %v %v", i, granted, err)
		}
	}
	if per := (examined() - before) / (size - 1); per > 4 {
		t.Errorf("with one address held back, an offer examined %d addresses on average", per)
	}
	// Fill the rest of the pool, then ask again and again: nothing is free.
	for i := size; ; i++ {
		got, _, ok := a.offer(p, mac(i), t0)
		if !ok {
			break
		}
		if granted, err := a.request(ctx, p, mac(i), got, t0); err != nil || !granted {
			t.Fatalf("request %d: %v %v", i, granted, err)
		}
	}
	before = examined()
	for i := range 100 {
		if got, _, ok := a.offer(p, net.HardwareAddr{2, 5, 0, 0, 0, byte(i)}.String(), t0.Add(time.Minute)); ok {
			t.Fatalf("exhausted pool offered %s", got)
		}
	}
	if per := (examined() - before) / 100; per > 100 {
		t.Errorf("exhausted pool: an offer examined %d addresses on average", per)
	}
	// Once a client gives its address back, or the held-back one is free again, it is offered.
	last := a.snapshot()[size/2]
	if err := a.release(ctx, last.MAC, last.IP); err != nil {
		t.Fatal(err)
	}
	if got, _, ok := a.offer(p, mac(1<<15), t0.Add(time.Minute)); !ok || got != last.IP {
		t.Fatalf("after a release: offered %s %v, want %s", got, ok, last.IP)
	}
	if got, _, ok := a.offer(p, mac(1<<15+1), t0.Add(2*time.Hour)); !ok || got != first {
		t.Fatalf("once the held-back address is free again: offered %s %v, want %s", got, ok, first)
	}
}

// TestRelayedClientRenewsDirectly: a client behind a relay renews (RENEWING, RFC 2131 §4.4.5)
// by a REQUEST unicast straight to the server, with ciaddr and no giaddr, and gives its
// address back the same way: the server finds the client's pool from ciaddr, not its own
// subnet. Also when the server's own address is in no pool (every client is relayed).
func TestRelayedClientRenewsDirectly(t *testing.T) {
	ctx := context.Background()
	relay := net.IPv4(10, 9, 0, 1)
	for _, onlyRelayed := range []bool{false, true} {
		t.Run(map[bool]string{false: "server on a pool subnet", true: "every pool relayed"}[onlyRelayed], func(t *testing.T) {
			ps := pools()
			if onlyRelayed {
				ps = ps[1:]
			}
			store := &memLeases{}
			s, err := New(ctx, Config{Mode: ModeFull, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base,
				Boot: Policy{EFIBinary: BinaryEFI}, Pools: ps, Leases: store, Now: (&clock{t0}).now})
			if err != nil {
				t.Fatal(err)
			}
			offer := s.Handle(ctx, ListenerDHCP, discover(t, macA, dhcpv4.WithGatewayIP(relay)))
			if offer == nil || offer.YourIPAddr.String() != "10.9.1.10" {
				t.Fatalf("relayed offer: %v", offer)
			}
			ack := s.Handle(ctx, ListenerDHCP, request(t, macA, dhcpv4.WithGatewayIP(relay),
				dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)), dhcpv4.WithOption(dhcpv4.OptServerIdentifier(serverIP.AsSlice()))))
			if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
				t.Fatalf("relayed request: %v", ack)
			}
			// Renewing: unicast from the client's address, no giaddr, no option 50.
			renew := request(t, macA, dhcpv4.WithClientIP(net.IPv4(10, 9, 1, 10)))
			r := s.Handle(ctx, ListenerDHCP, renew)
			if r == nil || r.MessageType() != dhcpv4.MessageTypeAck || r.YourIPAddr.String() != "10.9.1.10" {
				t.Fatalf("renewal: %v, want an ACK of 10.9.1.10", r)
			}
			if r.SubnetMask().String() != "ffff0000" || len(r.Router()) != 1 || r.Router()[0].String() != "10.9.0.1" {
				t.Fatalf("renewal carries another pool's options: %s", r.Summary())
			}
			if dst := ReplyAddr(ListenerDHCP, renew, r, netip.MustParseAddrPort("10.9.1.10:68"), 68, 67, netip.MustParseAddr("255.255.255.255")); dst.String() != "10.9.1.10:68" {
				t.Fatalf("renewal ACK goes to %s", dst)
			}
			// Released the same way: the lease ends.
			rel := mustNew(t, dhcpv4.WithHwAddr(macA), dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithClientIP(net.IPv4(10, 9, 1, 10)))
			s.Handle(ctx, ListenerDHCP, rel)
			if l := s.Leases(); len(l) != 0 {
				t.Fatalf("after the release: %+v", l)
			}
		})
	}
}

// TestPacketFloodsLoggedOncePerMinute: what a flood of packets makes the server say (anyone on
// the provisioning network can send them: made-up MACs exhaust a pool, an unsupported firmware
// retries forever) is logged once a minute, the next line saying how many were held back.
func TestPacketFloodsLoggedOncePerMinute(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		msg  string
		mode Mode
		pkt  func(i int) *dhcpv4.DHCPv4
	}{
		{"unsupported firmware", "network-boot client not served", ModeProxy,
			func(i int) *dhcpv4.DHCPv4 {
				return discover(t, net.HardwareAddr{2, 6, 0, 0, 0, byte(i)}, ia32PXE.mods()...)
			}},
		{"pool exhausted", "DHCP pool exhausted", ModeFull,
			func(i int) *dhcpv4.DHCPv4 { return discover(t, net.HardwareAddr{2, 7, 0, 0, 0, byte(i)}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logged bytes.Buffer
			clk := &clock{t0}
			cfg := Config{Mode: tt.mode, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI},
				Now: clk.now, Logger: slog.New(slog.NewJSONHandler(&logged, nil))}
			if tt.mode == ModeFull {
				cfg.Pools, cfg.Leases = pools(), &memLeases{}
			}
			s, err := New(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			lines := func() []map[string]any {
				var out []map[string]any
				for _, l := range strings.Split(strings.TrimSpace(logged.String()), "\n") {
					var m map[string]any
					if l == "" {
						continue
					}
					if err := json.Unmarshal([]byte(l), &m); err != nil {
						t.Fatal(err)
					}
					if m["msg"] == tt.msg {
						out = append(out, m)
					}
				}
				return out
			}
			if tt.mode == ModeFull { // the pool's 3 addresses leased
				for i := range 3 {
					r := s.Handle(ctx, ListenerDHCP, request(t, net.HardwareAddr{2, 8, 0, 0, 0, byte(i)},
						dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, byte(100+i))))))
					if r == nil || r.MessageType() != dhcpv4.MessageTypeAck {
						t.Fatalf("lease %d: %v", i, r)
					}
				}
			}
			for i := range 100 {
				s.Handle(ctx, ListenerDHCP, tt.pkt(i))
			}
			if got := lines(); len(got) != 1 {
				t.Fatalf("%d lines %q, want 1", len(got), tt.msg)
			}
			clk.t = clk.t.Add(time.Minute)
			s.Handle(ctx, ListenerDHCP, tt.pkt(200))
			if got := lines(); len(got) != 2 || got[1]["held_back"] != float64(99) {
				t.Fatalf("after a minute: %v, want a second line holding back 99", got)
			}
		})
	}
}

// TestLargePacketOverLoopback: a request larger than 1500 bytes (jumbo frames on the
// provisioning network, or a relay adding its option 82 to a large request, reassembled by IP)
// is read whole and answered, not truncated and dropped as malformed.
func TestLargePacketOverLoopback(t *testing.T) {
	_, c, dhcpAddr, _ := loopbackPair(t, ModeProxy)
	big := bytes.Repeat([]byte{'x'}, 2000) // the client's identifier: copied into the reply
	d := discover(t, macA, append(biosPXE.mods(), dhcpv4.WithOption(dhcpv4.OptGeneric(dhcpv4.OptionClientIdentifier, big)))...)
	if n := len(d.ToBytes()); n <= 1500 {
		t.Fatalf("request of %d bytes", n)
	}
	offer, _ := exchange(t, c, dhcpAddr, d)
	if offer.MessageType() != dhcpv4.MessageTypeOffer || offer.BootFileName != "undionly.kpxe" {
		t.Fatalf("offer: %s", offer.Summary())
	}
}

// TestFullModeObservesOnlyUsableAddresses: a RELEASE without ciaddr or a DECLINE without an
// address (malformed, or made up) passes no binding on: every binding names an address a client
// can hold.
func TestFullModeObservesOnlyUsableAddresses(t *testing.T) {
	ctx := context.Background()
	var o observed
	s, err := New(ctx, Config{Mode: ModeFull, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI},
		Pools: pools(), Leases: &memLeases{}, Now: (&clock{t0}).now, Observe: o.add})
	if err != nil {
		t.Fatal(err)
	}
	for _, pkt := range []*dhcpv4.DHCPv4{
		mustNew(t, dhcpv4.WithHwAddr(macA), dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease)),
		mustNew(t, dhcpv4.WithHwAddr(macA), dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithClientIP(net.IPv4bcast)),
		mustNew(t, dhcpv4.WithHwAddr(macA), dhcpv4.WithMessageType(dhcpv4.MessageTypeDecline), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4zero))),
	} {
		if r := s.Handle(ctx, ListenerDHCP, pkt); r != nil {
			t.Fatalf("answered %s", pkt.MessageType())
		}
	}
	for _, b := range o.take() {
		if !usableClientAddr(b.IP) {
			t.Errorf("passed on a binding of %s", b.IP)
		}
	}
}
