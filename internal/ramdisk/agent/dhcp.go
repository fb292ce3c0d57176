package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"golang.org/x/sys/unix"
)

// Lease is an IPv4 address obtained by DHCP.
type Lease struct {
	Interface string
	Address   netip.Prefix // address with the subnet's prefix length
	Router    netip.Addr   // invalid when the server named none
	DNS       []netip.Addr
	Server    netip.Addr
	Duration  time.Duration
}

// UDPClient is a DHCPv4 client on a UDP socket bound to one interface (SO_BINDTODEVICE),
// asking the server to broadcast its replies (the BROADCAST flag), so it needs no raw
// socket and no address before the lease. One Lease call is one DISCOVER/OFFER/REQUEST/ACK
// exchange under ctx.
type UDPClient struct {
	// Retransmit is the wait before a DISCOVER or REQUEST is sent again; default 2 s.
	Retransmit time.Duration
}

// Lease runs one DHCP exchange on ifname.
func (c UDPClient) Lease(ctx context.Context, ifname string, mac net.HardwareAddr) (Lease, error) {
	retrans := c.Retransmit
	if retrans <= 0 {
		retrans = 2 * time.Second
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			for _, o := range []int{unix.SO_REUSEADDR, unix.SO_BROADCAST} {
				if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o, 1); serr != nil {
					return
				}
			}
			serr = unix.BindToDevice(int(fd), ifname)
		})
		return errors.Join(err, serr)
	}}
	pc, err := lc.ListenPacket(ctx, "udp4", "0.0.0.0:68")
	if err != nil {
		return Lease{}, fmt.Errorf("dhcp on %s: opening socket: %w", ifname, err)
	}
	defer pc.Close()
	stop := context.AfterFunc(ctx, func() { _ = pc.SetDeadline(time.Now()) })
	defer stop()

	opts := []dhcpv4.Modifier{
		dhcpv4.WithBroadcast(true),
		dhcpv4.WithRequestedOptions(dhcpv4.OptionSubnetMask, dhcpv4.OptionRouter, dhcpv4.OptionDomainNameServer),
	}
	disc, err := dhcpv4.NewDiscovery(mac, opts...)
	if err != nil {
		return Lease{}, fmt.Errorf("dhcp on %s: building discover: %w", ifname, err)
	}
	offer, err := exchange(ctx, pc, disc, dhcpv4.MessageTypeOffer, retrans)
	if err != nil {
		return Lease{}, fmt.Errorf("dhcp on %s: waiting for an offer: %w", ifname, err)
	}
	req, err := dhcpv4.NewRequestFromOffer(offer, dhcpv4.WithBroadcast(true))
	if err != nil {
		return Lease{}, fmt.Errorf("dhcp on %s: building request: %w", ifname, err)
	}
	ack, err := exchange(ctx, pc, req, dhcpv4.MessageTypeAck, retrans)
	if err != nil {
		return Lease{}, fmt.Errorf("dhcp on %s: waiting for an ack: %w", ifname, err)
	}
	return leaseFromAck(ifname, ack)
}

// exchange sends msg to the broadcast address until a reply of type want with msg's
// transaction ID arrives, resending every retrans.
func exchange(ctx context.Context, pc net.PacketConn, msg *dhcpv4.DHCPv4, want dhcpv4.MessageType, retrans time.Duration) (*dhcpv4.DHCPv4, error) {
	dst := &net.UDPAddr{IP: net.IPv4bcast, Port: 67}
	buf := make([]byte, 1500)
	for {
		if _, err := pc.WriteTo(msg.ToBytes(), dst); err != nil {
			return nil, fmt.Errorf("sending %s: %w", msg.MessageType(), err)
		}
		deadline := time.Now().Add(retrans)
		if err := pc.SetReadDeadline(deadline); err != nil {
			return nil, err
		}
		for {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			n, _, err := pc.ReadFrom(buf)
			if isTimeout(err) {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				break // resend
			}
			if err != nil {
				return nil, fmt.Errorf("receiving: %w", err)
			}
			reply, err := dhcpv4.FromBytes(buf[:n])
			if err != nil || reply.OpCode != dhcpv4.OpcodeBootReply || reply.TransactionID != msg.TransactionID {
				continue // not ours
			}
			switch reply.MessageType() {
			case want:
				return reply, nil
			case dhcpv4.MessageTypeNak:
				return nil, errors.New("server answered NAK")
			}
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func leaseFromAck(ifname string, ack *dhcpv4.DHCPv4) (Lease, error) {
	ip, ok := netip.AddrFromSlice(ack.YourIPAddr.To4())
	if !ok || !ip.IsValid() || ip.IsUnspecified() {
		return Lease{}, fmt.Errorf("dhcp on %s: ack without an address", ifname)
	}
	bits := 24
	if m := ack.SubnetMask(); m != nil {
		if ones, size := m.Size(); size == 32 && ones > 0 {
			bits = ones
		}
	}
	l := Lease{Interface: ifname, Address: netip.PrefixFrom(ip, bits), Duration: ack.IPAddressLeaseTime(time.Hour)}
	if rs := ack.Router(); len(rs) > 0 {
		if r, ok := netip.AddrFromSlice(rs[0].To4()); ok {
			l.Router = r
		}
	}
	for _, d := range ack.DNS() {
		if a, ok := netip.AddrFromSlice(d.To4()); ok {
			l.DNS = append(l.DNS, a)
		}
	}
	if s, ok := netip.AddrFromSlice(ack.ServerIdentifier().To4()); ok {
		l.Server = s
	}
	return l, nil
}
