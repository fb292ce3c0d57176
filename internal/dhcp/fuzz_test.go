package dhcp

import (
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// FuzzHandle feeds raw packet bytes through parsing and every mode's chain: nothing may panic,
// every reply must be a BOOTREPLY of a known type that echoes the request's transaction, observe
// mode never answers, and every binding learned is one a client can hold.
func FuzzHandle(f *testing.F) {
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 1}
	seed := func(mods ...dhcpv4.Modifier) {
		d, err := dhcpv4.NewDiscovery(mac, mods...)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(d.ToBytes())
		d.UpdateOption(dhcpv4.OptMessageType(dhcpv4.MessageTypeRequest))
		d.UpdateOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 0, 100)))
		f.Add(d.ToBytes())
	}
	for _, c := range allClients() {
		seed(c.mods()...)
	}
	seed(dhcpv4.WithGatewayIP(net.IPv4(10, 9, 0, 1)))
	f.Add([]byte{})
	f.Add([]byte("not a dhcp packet"))

	ctx := context.Background()
	// Every binding learned from a packet names a 6-byte MAC and a usable unicast IPv4 address.
	var bad atomic.Pointer[Binding]
	check := func(b Binding) {
		if len(b.MAC) != 6 || !usableClientAddr(b.IP) {
			bad.Store(&b)
		}
	}
	proxy, err := New(ctx, Config{Mode: ModeProxy, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI, HaveARM64: true}, Observe: check})
	if err != nil {
		f.Fatal(err)
	}
	observe, err := New(ctx, Config{Mode: ModeObserve, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI}, Observe: check})
	if err != nil {
		f.Fatal(err)
	}
	full, err := New(ctx, Config{Mode: ModeFull, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI}, Pools: pools(), Leases: &memLeases{}, Observe: check})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := dhcpv4.FromBytes(b)
		if err != nil {
			return
		}
		for _, run := range []struct {
			s *Server
			l Listener
		}{{proxy, ListenerDHCP}, {proxy, ListenerPXE}, {full, ListenerDHCP}, {observe, ListenerDHCP}} {
			resp := run.s.Handle(ctx, run.l, req)
			if b := bad.Load(); b != nil {
				t.Fatalf("learned a binding no client can hold: %+v", *b)
			}
			if resp == nil {
				continue
			}
			if run.s == observe {
				t.Fatalf("observe mode answered: %s", resp.Summary())
			}
			if resp.OpCode != dhcpv4.OpcodeBootReply || resp.TransactionID != req.TransactionID {
				t.Fatalf("bad reply header: %s", resp.Summary())
			}
			switch resp.MessageType() {
			case dhcpv4.MessageTypeOffer, dhcpv4.MessageTypeAck, dhcpv4.MessageTypeNak:
			default:
				t.Fatalf("reply type %s", resp.MessageType())
			}
			if run.s == proxy && !resp.YourIPAddr.IsUnspecified() {
				t.Fatalf("proxy handed out %s", resp.YourIPAddr)
			}
			if y, ok := netip.AddrFromSlice(resp.YourIPAddr.To4()); ok && !y.IsUnspecified() {
				inPool := false
				for _, p := range pools() {
					inPool = inPool || p.Subnet.Contains(y)
				}
				if !inPool {
					t.Fatalf("address %s from no pool", y)
				}
			}
			_ = ReplyAddr(run.l, req, resp, netip.MustParseAddrPort("10.0.0.77:68"), 68, 67, netip.MustParseAddr("255.255.255.255"))
			if _, err := dhcpv4.FromBytes(resp.ToBytes()); err != nil {
				t.Fatalf("reply does not re-parse: %v", err)
			}
		}
	})
}
