package dhcp

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"go.uber.org/goleak"
)

// loopbackPair starts a server on 127.0.0.1 whose broadcasts and relay replies go to a client
// socket on 127.0.0.1, so no packet leaves the loopback interface.
func loopbackPair(t *testing.T, mode Mode) (srv *Server, client *net.UDPConn, dhcpAddr, pxeAddr *net.UDPAddr) {
	t.Helper()
	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	conn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	pxe, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	cport := client.LocalAddr().(*net.UDPAddr).Port
	lo := netip.MustParseAddr("127.0.0.1")
	cfg := Config{
		Mode: mode, ServerIP: lo, HTTPBaseURL: "http://127.0.0.1:8080", Boot: Policy{EFIBinary: BinaryEFI},
		Conn: conn, PXEConn: pxe, ClientPort: cport, RelayPort: cport, BroadcastAddr: lo,
	}
	if mode == ModeFull {
		cfg.Pools = []Pool{{Subnet: netip.MustParsePrefix("127.0.0.0/24"), Start: netip.MustParseAddr("127.0.0.100"), End: netip.MustParseAddr("127.0.0.110")}}
		cfg.Leases = &memLeases{}
	}
	srv, err = New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv, client, conn.LocalAddr().(*net.UDPAddr), pxe.LocalAddr().(*net.UDPAddr)
}

func exchange(t *testing.T, c *net.UDPConn, to *net.UDPAddr, req *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, *net.UDPAddr) {
	t.Helper()
	if _, err := c.WriteToUDP(req.ToBytes(), to); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<16) // a reply may be larger than an Ethernet frame (TestLargePacketOverLoopback)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		n, from, err := c.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("waiting for a reply: %v", err)
		}
		resp, err := dhcpv4.FromBytes(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
		if resp.TransactionID == req.TransactionID {
			return resp, from
		}
	}
}

func TestFullModeOverLoopback(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	srv, c, dhcpAddr, _ := loopbackPair(t, ModeFull)
	offer, _ := exchange(t, c, dhcpAddr, discover(t, macA, efiPXE.mods()...))
	if offer.MessageType() != dhcpv4.MessageTypeOffer || offer.YourIPAddr.String() != "127.0.0.100" || offer.BootFileName != "ipxe.efi" {
		t.Fatalf("offer: %s", offer.Summary())
	}
	req, err := dhcpv4.NewRequestFromOffer(offer, efiPXE.mods()...)
	if err != nil {
		t.Fatal(err)
	}
	ack, _ := exchange(t, c, dhcpAddr, req)
	if ack.MessageType() != dhcpv4.MessageTypeAck || ack.YourIPAddr.String() != "127.0.0.100" {
		t.Fatalf("ack: %s", ack.Summary())
	}
	// Relayed: the reply comes back to the relay (giaddr:RelayPort), here the client socket.
	relayed := discover(t, macB, dhcpv4.WithGatewayIP(net.IPv4(127, 0, 0, 1)))
	r, _ := exchange(t, c, dhcpAddr, relayed)
	if r.YourIPAddr.String() != "127.0.0.101" || !r.GatewayIPAddr.Equal(net.IPv4(127, 0, 0, 1)) {
		t.Fatalf("relayed offer: %s", r.Summary())
	}
	if srv.Counters().Offers.Load() != 2 || srv.Counters().Acks.Load() != 1 {
		t.Fatalf("counters %d offers %d acks", srv.Counters().Offers.Load(), srv.Counters().Acks.Load())
	}
}

func TestProxyModeOverLoopback(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	srv, c, dhcpAddr, pxeAddr := loopbackPair(t, ModeProxy)
	offer, _ := exchange(t, c, dhcpAddr, discover(t, macA, biosPXE.mods()...))
	if offer.MessageType() != dhcpv4.MessageTypeOffer || !offer.YourIPAddr.IsUnspecified() || offer.BootFileName != "undionly.kpxe" {
		t.Fatalf("proxy offer: %s", offer.Summary())
	}
	req := request(t, macA, append(ipxeBIOS.mods(), dhcpv4.WithClientIP(net.IPv4(127, 0, 0, 1)))...)
	ack, from := exchange(t, c, pxeAddr, req)
	if ack.MessageType() != dhcpv4.MessageTypeAck || ack.BootFileName != "http://127.0.0.1:8080/boot.ipxe?mac=${net0/mac}&uuid=${uuid}&arch=${buildarch}" {
		t.Fatalf("proxy ack: %s", ack.Summary())
	}
	if from.Port != pxeAddr.Port {
		t.Fatalf("4011 reply came from port %d", from.Port)
	}
	// Garbage and non-PXE packets are counted as ignored, and the server keeps serving.
	c.WriteToUDP([]byte("not dhcp"), dhcpAddr)
	c.WriteToUDP(discover(t, macB).ToBytes(), dhcpAddr)
	again, _ := exchange(t, c, dhcpAddr, discover(t, macB, efiHTTP.mods()...))
	if again.BootFileName != "http://127.0.0.1:8080/ipxe/ipxe.efi" {
		t.Fatalf("http boot offer: %s", again.Summary())
	}
	// Packets are handled concurrently: the two ignored ones may finish after the answered one.
	waitFor(t, func() bool { return srv.Counters().Ignored.Load() >= 2 })
	if n := srv.Counters().Ignored.Load(); n != 2 {
		t.Fatalf("ignored = %d, want 2", n)
	}
}
