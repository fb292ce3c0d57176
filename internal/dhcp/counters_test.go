package dhcp

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
)

// counts is a copy of the counters the site agent exports, for comparisons.
type counts struct {
	requests   [NumRequestTypes]uint64
	sent       [NumReplyTypes]uint64
	unanswered [NumUnanswered]uint64
}

func snapshot(c *Counters) counts {
	var s counts
	for i := range s.requests {
		s.requests[i] = c.Requests[i].Load()
	}
	for i := range s.sent {
		s.sent[i] = c.Sent[i].Load()
	}
	for i := range s.unanswered {
		s.unanswered[i] = c.Unanswered[i].Load()
	}
	return s
}

// Every request Handle does not answer is counted once, under the reason the chain gave, and
// under its message type; nothing else moves.
func TestCountersUnanswered(t *testing.T) {
	ctx := context.Background()
	other := dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(10, 0, 0, 2)))
	ours := dhcpv4.WithOption(dhcpv4.OptServerIdentifier(serverIP.AsSlice()))
	tests := []struct {
		name  string
		mode  Mode
		store LeaseStore
		pools []Pool
		l     Listener
		req   func(t *testing.T) *dhcpv4.DHCPv4
		want  Unanswered
		typ   RequestType
	}{
		{name: "not a boot request", mode: ModeProxy, req: func(t *testing.T) *dhcpv4.DHCPv4 {
			d := discover(t, macA, biosPXE.mods()...)
			d.HWType = iana.HWTypeIEEE802
			return d
		}, want: UnansweredNotBootRequest, typ: RequestDiscover},
		{name: "proxy: not a network-boot client", mode: ModeProxy,
			req: func(t *testing.T) *dhcpv4.DHCPv4 { return discover(t, macA) }, want: UnansweredNotNetboot, typ: RequestDiscover},
		{name: "proxy: no binary for the firmware", mode: ModeProxy,
			req: func(t *testing.T) *dhcpv4.DHCPv4 { return discover(t, macA, ia32PXE.mods()...) }, want: UnansweredNoBinary, typ: RequestDiscover},
		{name: "proxy: request for another server", mode: ModeProxy,
			req: func(t *testing.T) *dhcpv4.DHCPv4 { return request(t, macA, append(biosPXE.mods(), other)...) }, want: UnansweredOtherServer, typ: RequestRequest},
		{name: "proxy: release", mode: ModeProxy,
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return request(t, macA, append(biosPXE.mods(), dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease))...)
			}, want: UnansweredMessageType, typ: RequestRelease},
		{name: "proxy: PXE port in full mode", mode: ModeFull, l: ListenerPXE,
			req: func(t *testing.T) *dhcpv4.DHCPv4 { return request(t, macA, biosPXE.mods()...) }, want: UnansweredNotServed, typ: RequestRequest},
		{name: "observe: never answered", mode: ModeObserve,
			req: func(t *testing.T) *dhcpv4.DHCPv4 { return discover(t, macA, biosPXE.mods()...) }, want: UnansweredObserved, typ: RequestDiscover},
		{name: "full: request for another server", mode: ModeFull,
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return request(t, macA, other, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 100))))
			}, want: UnansweredOtherServer, typ: RequestRequest},
		{name: "full: release", mode: ModeFull,
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return request(t, macA, dhcpv4.WithMessageType(dhcpv4.MessageTypeRelease), dhcpv4.WithClientIP(net.IPv4(10, 0, 0, 100)))
			}, want: UnansweredReleased, typ: RequestRelease},
		{name: "full: decline", mode: ModeFull,
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return request(t, macA, dhcpv4.WithMessageType(dhcpv4.MessageTypeDecline), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 100))))
			}, want: UnansweredReleased, typ: RequestDecline},
		{name: "full: unanswered message type", mode: ModeFull,
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return request(t, macA, dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer))
			}, want: UnansweredMessageType, typ: RequestOther},
		{name: "full: no pool for the relay's subnet", mode: ModeFull,
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return discover(t, macA, dhcpv4.WithGatewayIP(net.IPv4(192, 0, 2, 1)))
			}, want: UnansweredNoPool, typ: RequestDiscover},
		{name: "full: pool exhausted", mode: ModeFull, store: &memLeases{leases: []Lease{
			{MAC: "52:54:00:00:00:99", IP: netip.MustParseAddr("10.0.0.100"), Expires: time.Now().Add(time.Hour)}}},
			pools: []Pool{{Subnet: netip.MustParsePrefix("10.0.0.0/24"), Start: netip.MustParseAddr("10.0.0.100"), End: netip.MustParseAddr("10.0.0.100")}},
			req:   func(t *testing.T) *dhcpv4.DHCPv4 { return discover(t, macA) }, want: UnansweredPoolExhausted, typ: RequestDiscover},
		{name: "full: lease not saved", mode: ModeFull, store: &memLeases{fail: errors.New("disk full")},
			req: func(t *testing.T) *dhcpv4.DHCPv4 {
				return request(t, macA, ours, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 100))))
			}, want: UnansweredLeaseNotSaved, typ: RequestRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Mode: tc.mode, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI},
				Counters: &Counters{}, Observe: func(Binding) {}}
			if tc.mode == ModeFull {
				cfg.Pools, cfg.Leases = pools(), tc.store
				if tc.pools != nil {
					cfg.Pools = tc.pools
				}
				if cfg.Leases == nil {
					cfg.Leases = &memLeases{}
				}
			}
			s, err := New(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			before := snapshot(cfg.Counters)
			if r := s.Handle(ctx, tc.l, tc.req(t)); r != nil {
				t.Fatalf("answered with %s", r.MessageType())
			}
			want := before
			want.unanswered[tc.want]++
			want.requests[tc.typ]++
			if got := snapshot(cfg.Counters); got != want {
				t.Errorf("counters moved to\n%+v, want\n%+v", got, want)
			}
		})
	}
}

// Over sockets: every packet read is counted as a request, and each is then a reply sent (by
// type) or unanswered (by reason).
func TestCountersOverLoopback(t *testing.T) {
	for _, mode := range []Mode{ModeProxy, ModeFull} {
		t.Run(string(mode), func(t *testing.T) {
			srv, c, dhcpAddr, pxeAddr := loopbackPair(t, mode)
			offer, _ := exchange(t, c, dhcpAddr, discover(t, macA, biosPXE.mods()...))
			want := counts{}
			want.requests[RequestDiscover]++
			if mode == ModeProxy {
				want.sent[ReplyProxyOffer]++
				exchange(t, c, pxeAddr, request(t, macA, append(ipxeBIOS.mods(), dhcpv4.WithClientIP(net.IPv4(127, 0, 0, 1)))...))
				want.sent[ReplyProxyAck]++
			} else {
				want.sent[ReplyOffer]++
				exchange(t, c, dhcpAddr, request(t, macA, append(biosPXE.mods(),
					dhcpv4.WithOption(dhcpv4.OptServerIdentifier(net.IPv4(127, 0, 0, 1))),
					dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)))...))
				want.sent[ReplyAck]++
			}
			want.requests[RequestRequest]++
			if _, err := c.WriteToUDP([]byte("not dhcp"), dhcpAddr); err != nil {
				t.Fatal(err)
			}
			want.requests[RequestMalformed]++
			want.unanswered[UnansweredMalformed]++
			// Handled concurrently: the malformed packet may be counted after the replies came.
			waitFor(t, func() bool { return snapshot(srv.Counters()) == want })
			if got := snapshot(srv.Counters()); got != want {
				t.Errorf("counters\n%+v, want\n%+v", got, want)
			}
		})
	}
}

// BenchmarkHandleProxyDiscover is the DHCP hot path: a proxy DISCOVER from PXE firmware,
// counted.
func BenchmarkHandleProxyDiscover(b *testing.B) {
	s, err := New(context.Background(), Config{Mode: ModeProxy, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base,
		Boot: Policy{EFIBinary: BinaryEFI}, Counters: &Counters{}})
	if err != nil {
		b.Fatal(err)
	}
	req, err := dhcpv4.NewDiscovery(macA, biosPXE.mods()...)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if s.Handle(ctx, ListenerDHCP, req) == nil {
			b.Fatal("no offer")
		}
	}
}
