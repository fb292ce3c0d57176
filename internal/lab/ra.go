package lab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
)

// ICMPv6 types and NDP option types (RFC 4861).
const (
	icmpRouterSolicitation  = 133
	icmpRouterAdvertisement = 134
	ndpOptSourceLinkAddr    = 1
	ndpOptPrefixInfo        = 3
)

// RA lifetimes: the prefix is on-link and for SLAAC; we are no default router (lifetime 0), and
// the M and O flags are clear (ra-only: no DHCPv6), so iPXE's IPv6 configuration ends at the
// first advertisement instead of waiting for a router (LAB-NOTES gotcha 1).
const (
	raValidLifetime     = 86400
	raPreferredLifetime = 14400
	raInterval          = 10 * time.Second
)

// RouterAdvertisement is the ICMPv6 message (checksum left zero: the kernel fills it in for raw
// ICMPv6 sockets) advertising prefix p from an interface with hardware address mac. Pure.
func RouterAdvertisement(p netip.Prefix, mac net.HardwareAddr) []byte {
	b := make([]byte, 16, 16+32+8)
	b[0] = icmpRouterAdvertisement
	b[4] = 64                            // current hop limit
	b[5] = 0                             // flags: no M, no O
	binary.BigEndian.PutUint16(b[6:], 0) // router lifetime: not a default router
	// reachable time and retrans timer (b[8:16]) unspecified
	pi := make([]byte, 32)
	pi[0], pi[1] = ndpOptPrefixInfo, 4
	pi[2] = byte(p.Bits())
	pi[3] = 0xc0 // on-link, autonomous
	binary.BigEndian.PutUint32(pi[4:], raValidLifetime)
	binary.BigEndian.PutUint32(pi[8:], raPreferredLifetime)
	a := p.Masked().Addr().As16()
	copy(pi[16:], a[:])
	b = append(b, pi...)
	if len(mac) == 6 {
		b = append(b, ndpOptSourceLinkAddr, 1)
		b = append(b, mac...)
	}
	return b
}

// advertise sends router advertisements for prefix on the interface named ifname: at once when
// a router solicitation arrives, and every raInterval. It runs until ctx ends.
func advertise(ctx context.Context, ifname string, prefix netip.Prefix, log *slog.Logger) error {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return fmt.Errorf("sending router advertisements on %s: %w", ifname, err)
	}
	c, err := icmp.ListenPacket("ip6:ipv6-icmp", "::")
	if err != nil {
		return fmt.Errorf("sending router advertisements on %s: %w", ifname, err)
	}
	defer c.Close()
	p := c.IPv6PacketConn()
	var filter ipv6.ICMPFilter
	filter.SetAll(true)
	filter.Accept(ipv6.ICMPType(icmpRouterSolicitation))
	allRouters := &net.IPAddr{IP: net.ParseIP("ff02::2")}
	for _, set := range []error{
		p.SetICMPFilter(&filter),
		p.SetMulticastHopLimit(255),
		p.SetHopLimit(255),
		p.SetMulticastLoopback(false),
		p.SetMulticastInterface(ifi),
		p.JoinGroup(ifi, allRouters),
		p.SetControlMessage(ipv6.FlagInterface, true),
	} {
		if set != nil {
			return fmt.Errorf("sending router advertisements on %s: %w", ifname, set)
		}
	}
	msg := RouterAdvertisement(prefix, ifi.HardwareAddr)
	allNodes := &net.IPAddr{IP: net.ParseIP("ff02::1"), Zone: ifname}
	send := func(why string) {
		if _, err := p.WriteTo(msg, &ipv6.ControlMessage{HopLimit: 255, IfIndex: ifi.Index}, allNodes); err != nil {
			// Before a tap has carrier the bridge has no link-local address yet: try again later.
			log.DebugContext(ctx, "router advertisement not sent", "why", why, "err", err)
			return
		}
		log.DebugContext(ctx, "router advertisement sent", "why", why)
	}
	solicited := make(chan struct{}, 1)
	go func() {
		buf := make([]byte, 1500)
		for {
			n, cm, _, err := p.ReadFrom(buf)
			if err != nil {
				return // closed
			}
			if n > 0 && buf[0] == icmpRouterSolicitation && (cm == nil || cm.IfIndex == ifi.Index) {
				select {
				case solicited <- struct{}{}:
				default:
				}
			}
		}
	}()
	tick := time.NewTicker(raInterval)
	defer tick.Stop()
	send("start")
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				return nil
			}
			return ctx.Err()
		case <-solicited:
			send("solicited")
		case <-tick.C:
			send("periodic")
		}
	}
}
