// Package dhcp is the site agent's DHCP service for network boot: proxy-DHCP (ports 67 and
// 4011, beside the site's own DHCP server), full DHCP (leases from configured pools), observe
// (answers nothing; learns which address each client takes) or off.
// A packet goes through a chain of small handlers wired by New; the boot-file decision is the
// pure function BootFile.
package dhcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"bcd/internal/lograte"
	"bcd/internal/netboot"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/insomniacslk/dhcp/iana"
	"golang.org/x/sync/errgroup"
)

// Mode selects what the DHCP service does.
type Mode string

const (
	ModeOff   Mode = "off"   // the site's DHCP server points next-server at us; nothing runs
	ModeProxy Mode = "proxy" // answer PXE/HTTP-boot clients only, never hand out addresses
	ModeFull  Mode = "full"  // hand out addresses from pools, plus boot options to netboot clients
	// ModeObserve answers nothing: beside a site DHCP server that does the network boot, it
	// learns from the requests it sees (its segment, or relayed to it) which address each
	// client takes (Config.Observe), for the boot binding.
	ModeObserve Mode = "observe"
)

// Listener says which socket a packet arrived on.
type Listener int

const (
	ListenerDHCP Listener = iota // port 67
	ListenerPXE                  // port 4011 (proxy mode's PXE boot server)
)

// Handler is one link of the chain. It reads req, edits resp, and returns stop=true to end the
// chain. A response still without a message type when the chain ends is not sent.
type Handler func(ctx context.Context, req, resp *dhcpv4.DHCPv4) (stop bool)

// Config configures the DHCP service.
type Config struct {
	Mode        Mode
	Interface   string     // provisioning interface (SO_BINDTODEVICE); required unless sockets are given
	ServerIP    netip.Addr // our IPv4 on the provisioning network: server identifier and TFTP next-server
	HTTPBaseURL string     // http://<site>:<port>, where netboot.Handler is served
	Boot        Policy

	// Full mode.
	Pools        []Pool
	Reservations []Reservation
	Leases       LeaseStore
	// Known: leases another agent of the site granted (the control plane passes them to a new
	// boot-lease holder). Merged with Leases' at start; where a MAC or an address has two, the
	// one that runs longer wins.
	Known []Lease
	// Probe, when set, is asked whether something on the network answers at an address before
	// it is offered to a client it is new to (not the client's lease or reservation), for
	// ProbeFor after the service starts (0: the longest lease time of the pools). Another
	// server of the site may have granted leases in its last moments that this one was never
	// told of (the boot lease changed hands); their clients come back to this one only when they
	// renew. An address that answers is not offered, and is held back for a lease time.
	Probe    Prober
	ProbeFor time.Duration

	// Observe, when set, learns which address each client MAC holds (see Binding): in full
	// mode every lease granted or given back, and the leases loaded at start; in proxy and
	// observe modes every address a client was seen requesting from the site's own DHCP server.
	// It runs on the packet's goroutine and must not block.
	Observe func(Binding)

	Counters *Counters // nil: the server keeps its own (see Server.Counters)
	Logger   *slog.Logger
	Now      func() time.Time

	// Sockets and ports; zero values are the standard ones. Tests bind loopback sockets and
	// point broadcasts at loopback so nothing leaves the machine.
	Conn          net.PacketConn // port 67
	PXEConn       net.PacketConn // port 4011 (proxy mode)
	ClientPort    int            // 68
	RelayPort     int            // 67
	BroadcastAddr netip.Addr     // 255.255.255.255
}

// Binding is an address a client MAC holds, as this service saw it: a lease it granted (full
// mode, Expires set) or an address the client asked the site's own DHCP server for (proxy and
// observe modes, Expires zero: that server alone knows). Released: the client gave the address
// back or declined it. The site agent serves a MAC's boot script, and a node's metadata, only
// to the address bound to it.
type Binding struct {
	MAC      net.HardwareAddr
	IP       netip.Addr
	Expires  time.Time
	Released bool
}

// Server is a running DHCP service.
type Server struct {
	cfg      Config
	counters *Counters
	log      *slog.Logger
	now      func() time.Time
	alloc    *allocator
	chains   map[Listener][]Handler
	// probeUntil ends the time new addresses are probed (Config.Probe); probeFailed is set once
	// a probe could not be made (said once in the log).
	probeUntil  time.Time
	probeFailed atomic.Bool
	// quiet holds back the repeats of what a packet flood could make the server say: one line
	// per key (fixed strings of this package: per message, per pool, never packet data) and
	// quietInterval.
	quiet *lograte.Limiter
}

// quietInterval spaces the log lines a packet flood could repeat (Server.quiet); its keys are
// this package's, a few per pool (quietKeys is a bound, not a size).
const (
	quietInterval = time.Minute
	quietKeys     = 4096
)

// New validates cfg, loads the leases (full mode) and wires the handler chains.
func New(ctx context.Context, cfg Config) (*Server, error) {
	s := &Server{cfg: cfg, counters: cfg.Counters, log: cfg.Logger, now: cfg.Now, quiet: lograte.New(quietInterval, quietKeys)}
	if s.counters == nil {
		s.counters = &Counters{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.cfg.ClientPort == 0 {
		s.cfg.ClientPort = dhcpv4.ClientPort
	}
	if s.cfg.RelayPort == 0 {
		s.cfg.RelayPort = dhcpv4.ServerPort
	}
	if !s.cfg.BroadcastAddr.IsValid() {
		s.cfg.BroadcastAddr = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	}
	switch cfg.Mode {
	case ModeOff:
		return s, nil
	case ModeProxy, ModeFull:
	case ModeObserve:
		if cfg.Observe == nil {
			return nil, errors.New("dhcp: observe mode needs an observer (Config.Observe)")
		}
	default:
		return nil, fmt.Errorf("dhcp: mode %q: accepted are off, proxy, full, observe", cfg.Mode)
	}
	if !cfg.ServerIP.Is4() {
		return nil, errors.New("dhcp: server IP must be an IPv4 address")
	}
	if err := cfg.Boot.Validate(); err != nil {
		return nil, fmt.Errorf("dhcp: %w", err)
	}
	if !strings.HasPrefix(cfg.HTTPBaseURL, "http://") || strings.HasSuffix(cfg.HTTPBaseURL, "/") || strings.ContainsAny(cfg.HTTPBaseURL, "?# \n") {
		return nil, errors.New("dhcp: HTTP base URL must be http://host[:port] without trailing slash")
	}
	if cfg.Interface == "" && (cfg.Conn == nil || cfg.BroadcastAddr == netip.AddrFrom4([4]byte{255, 255, 255, 255}) || !cfg.BroadcastAddr.IsValid()) {
		return nil, errors.New("dhcp: an interface is required (broadcast replies must leave on the provisioning network only)")
	}
	mac := []Handler{s.onlyBootRequests}
	switch cfg.Mode {
	case ModeObserve:
		s.chains = map[Listener][]Handler{ListenerDHCP: append(mac, s.observeRequest)}
	case ModeProxy:
		s.chains = map[Listener][]Handler{
			ListenerDHCP: append(mac, s.observeRequest, s.proxyMessage(ListenerDHCP), s.proxyOptions, s.bootOptions(true)),
			ListenerPXE:  append(mac, s.observeRequest, s.proxyMessage(ListenerPXE), s.proxyOptions, s.bootOptions(true)),
		}
	case ModeFull:
		if len(cfg.Pools) == 0 || cfg.Leases == nil {
			return nil, errors.New("dhcp: full mode needs pools and a lease store")
		}
		for _, p := range cfg.Pools {
			if err := p.validate(); err != nil {
				return nil, fmt.Errorf("dhcp: %w", err)
			}
		}
		alloc, err := newAllocator(ctx, cfg.Pools, cfg.Reservations, cfg.Leases, cfg.Known, cfg.ServerIP, s.now())
		if err != nil {
			return nil, fmt.Errorf("dhcp: %w", err)
		}
		s.alloc = alloc
		if cfg.Probe != nil {
			d := cfg.ProbeFor
			for _, p := range cfg.Pools {
				if lt := leaseTime(&p); cfg.ProbeFor == 0 && lt > d {
					d = lt
				}
			}
			s.probeUntil = s.now().Add(d)
		}
		if cfg.Observe != nil {
			now := s.now()
			for _, l := range alloc.snapshot() {
				if mac, err := net.ParseMAC(l.MAC); err == nil && l.Expires.After(now) {
					cfg.Observe(Binding{MAC: mac, IP: l.IP, Expires: l.Expires})
				}
			}
		}
		s.chains = map[Listener][]Handler{
			ListenerDHCP: append(mac, s.forUs, s.assignAddress, s.networkOptions, s.bootOptions(false)),
		}
	}
	return s, nil
}

// Counters returns the live counters.
func (s *Server) Counters() *Counters { return s.counters }

// Leases returns the current full-mode leases (nil in other modes).
func (s *Server) Leases() []Lease {
	if s.alloc == nil {
		return nil
	}
	return s.alloc.snapshot()
}

// Handle runs the chain of listener l for req and returns the reply, or nil when none is due.
func (s *Server) Handle(ctx context.Context, l Listener, req *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	s.counters.Requests[requestType(req)].Add(1)
	chain := s.chains[l]
	if chain == nil {
		s.unanswered(UnansweredNotServed)
		return nil
	}
	resp, err := dhcpv4.NewReplyFromRequest(req)
	if err != nil {
		s.log.ErrorContext(ctx, "building DHCP reply", "err", err)
		s.unanswered(UnansweredMalformed)
		return nil
	}
	wctx := &whyCtx{Context: ctx, why: UnansweredOther}
	if s.cfg.Mode == ModeObserve {
		wctx.why = UnansweredObserved
	}
	for _, h := range chain {
		if h(wctx, req, resp) {
			break
		}
	}
	switch resp.MessageType() {
	case dhcpv4.MessageTypeOffer:
		s.counters.Offers.Add(1)
	case dhcpv4.MessageTypeAck:
		s.counters.Acks.Add(1)
	case dhcpv4.MessageTypeNak:
		s.counters.Naks.Add(1)
	default:
		s.unanswered(wctx.why)
		return nil
	}
	return resp
}

// unanswered counts a request no reply is due to, and why.
func (s *Server) unanswered(why Unanswered) {
	s.counters.Ignored.Add(1)
	s.counters.Unanswered[why].Add(1)
}

// ReplyAddr is where a reply goes (RFC 2131 §4.1): back to the source on the PXE port, to the
// relay when relayed, broadcast for a NAK or a client without an address, else to ciaddr.
func ReplyAddr(l Listener, req, resp *dhcpv4.DHCPv4, peer netip.AddrPort, clientPort, relayPort int, bcast netip.Addr) netip.AddrPort {
	if l == ListenerPXE {
		return peer
	}
	if gi, ok := netip.AddrFromSlice(req.GatewayIPAddr.To4()); ok && !gi.IsUnspecified() {
		return netip.AddrPortFrom(gi, uint16(relayPort))
	}
	if resp.MessageType() == dhcpv4.MessageTypeNak {
		return netip.AddrPortFrom(bcast, uint16(clientPort))
	}
	if ci, ok := netip.AddrFromSlice(req.ClientIPAddr.To4()); ok && !ci.IsUnspecified() {
		return netip.AddrPortFrom(ci, uint16(clientPort))
	}
	return netip.AddrPortFrom(bcast, uint16(clientPort))
}

// Serve answers packets until ctx ends. Mode off returns at once.
func (s *Server) Serve(ctx context.Context) error {
	if s.cfg.Mode == ModeOff {
		return nil
	}
	conns := map[Listener]net.PacketConn{ListenerDHCP: s.cfg.Conn}
	if s.cfg.Mode == ModeProxy {
		conns[ListenerPXE] = s.cfg.PXEConn
	}
	ports := map[Listener]int{ListenerDHCP: dhcpv4.ServerPort, ListenerPXE: 4011}
	for l, c := range conns {
		if c != nil {
			continue
		}
		uc, err := server4.NewIPv4UDPConn(s.cfg.Interface, &net.UDPAddr{Port: ports[l]})
		if err != nil {
			for _, c := range conns {
				if c != nil {
					c.Close()
				}
			}
			return fmt.Errorf("dhcp: listening on %s port %d: %w", s.cfg.Interface, ports[l], err)
		}
		conns[l] = uc
	}
	g, ctx := errgroup.WithContext(ctx)
	for l, c := range conns {
		g.Go(func() error { return s.serveConn(ctx, l, c) })
	}
	g.Go(func() error {
		<-ctx.Done()
		for _, c := range conns {
			c.Close()
		}
		return nil
	})
	return g.Wait()
}

// maxInFlight bounds the packets of one socket handled at once. An acknowledgement waits for the
// lease store (a file write and fsync): the packets that arrive meanwhile are handled beside it,
// offers answered at once and acknowledgements sharing the next save (allocator.sync), instead
// of queueing behind it one by one.
const maxInFlight = 256

// serveConn reads c until ctx ends and handles each packet on a goroutine of its own (at most
// maxInFlight at once); it returns once they are all done.
func (s *Server) serveConn(ctx context.Context, l Listener, c net.PacketConn) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	slots := make(chan struct{}, maxInFlight)
	// Any UDP datagram is read whole (a request above 1500 bytes: jumbo frames, or one IP
	// reassembled); each packet's goroutine gets a copy of its bytes only.
	buf := make([]byte, 1<<16)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("dhcp: reading: %w", err)
		}
		ua, ok := from.(*net.UDPAddr)
		if !ok {
			continue
		}
		pkt := bytes.Clone(buf[:n])
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			s.serveOne(ctx, l, c, pkt, ua.AddrPort())
		})
	}
}

// serveOne answers one packet read from c.
func (s *Server) serveOne(ctx context.Context, l Listener, c net.PacketConn, b []byte, from netip.AddrPort) {
	req, err := dhcpv4.FromBytes(b)
	if err != nil {
		s.counters.Requests[RequestMalformed].Add(1)
		s.unanswered(UnansweredMalformed)
		return
	}
	resp := s.Handle(ctx, l, req)
	if resp == nil {
		return
	}
	dst := ReplyAddr(l, req, resp, from, s.cfg.ClientPort, s.cfg.RelayPort, s.cfg.BroadcastAddr)
	if _, err := c.WriteTo(resp.ToBytes(), net.UDPAddrFromAddrPort(dst)); err != nil {
		s.counters.Unanswered[UnansweredSendFailed].Add(1)
		if ctx.Err() == nil {
			s.quiet.Log(ctx, s.log, slog.LevelWarn, s.now(), "send", "sending DHCP reply", "to", dst.String(), "err", err)
		}
		return
	}
	if t, ok := replyType(s.cfg.Mode, resp); ok {
		s.counters.Sent[t].Add(1)
	}
	s.log.DebugContext(ctx, "DHCP reply sent", "type", resp.MessageType().String(), "mac", req.ClientHWAddr.String(), "to", dst.String())
}

func setType(resp *dhcpv4.DHCPv4, t dhcpv4.MessageType) {
	resp.UpdateOption(dhcpv4.OptMessageType(t))
}

func clearType(resp *dhcpv4.DHCPv4) { resp.Options.Del(dhcpv4.OptionDHCPMessageType) }

// onlyBootRequests drops anything that is not an Ethernet BOOTREQUEST with a 6-byte MAC.
func (s *Server) onlyBootRequests(ctx context.Context, req, resp *dhcpv4.DHCPv4) bool {
	if req.OpCode != dhcpv4.OpcodeBootRequest || req.HWType != iana.HWTypeEthernet || len(req.ClientHWAddr) != 6 {
		return drop(ctx, resp, UnansweredNotBootRequest)
	}
	return false
}

// observeRequest (proxy and observe modes) passes on the address a client requests, whichever
// server it asks and whatever it boots: a REQUEST's option 50 (selecting, init-reboot) or its
// ciaddr (renewing, and the PXE request to port 4011), an INFORM's ciaddr. It never stops the
// chain.
func (s *Server) observeRequest(_ context.Context, req, _ *dhcpv4.DHCPv4) bool {
	if s.cfg.Observe == nil {
		return false
	}
	var ip net.IP
	switch req.MessageType() {
	case dhcpv4.MessageTypeRequest:
		if ip = req.RequestedIPAddress(); ip == nil || ip.IsUnspecified() {
			ip = req.ClientIPAddr
		}
	case dhcpv4.MessageTypeInform:
		ip = req.ClientIPAddr
	default:
		return false
	}
	if a, ok := netip.AddrFromSlice(ip.To4()); ok && usableClientAddr(a) {
		s.cfg.Observe(Binding{MAC: slices.Clone(req.ClientHWAddr), IP: a})
	}
	return false
}

// usableClientAddr: a unicast IPv4 a client can hold (not 0.0.0.0, broadcast, multicast or
// loopback).
func usableClientAddr(a netip.Addr) bool {
	return a.Is4() && !a.IsUnspecified() && !a.IsMulticast() && !a.IsLoopback() && a != netip.AddrFrom4([4]byte{255, 255, 255, 255})
}

func isNetbootVendor(req *dhcpv4.DHCPv4) bool { return vendorKind(req.ClassIdentifier()) != "" }

// proxyMessage picks the reply type in proxy mode: PXE/HTTP clients only; DISCOVER on 67 →
// OFFER, REQUEST (or INFORM) on 4011 → ACK, REQUEST on 67 only when addressed to us.
func (s *Server) proxyMessage(l Listener) Handler {
	return func(ctx context.Context, req, resp *dhcpv4.DHCPv4) bool {
		if !isNetbootVendor(req) {
			return drop(ctx, resp, UnansweredNotNetboot)
		}
		mt := req.MessageType()
		switch {
		case l == ListenerDHCP && mt == dhcpv4.MessageTypeDiscover:
			setType(resp, dhcpv4.MessageTypeOffer)
		case l == ListenerDHCP && mt == dhcpv4.MessageTypeRequest && s.isOurServerID(req):
			setType(resp, dhcpv4.MessageTypeAck)
		case l == ListenerPXE && (mt == dhcpv4.MessageTypeRequest || mt == dhcpv4.MessageTypeInform):
			setType(resp, dhcpv4.MessageTypeAck)
		case l == ListenerDHCP && mt == dhcpv4.MessageTypeRequest:
			return drop(ctx, resp, UnansweredOtherServer)
		default:
			return drop(ctx, resp, UnansweredMessageType)
		}
		return false
	}
}

func (s *Server) isOurServerID(req *dhcpv4.DHCPv4) bool {
	id, ok := netip.AddrFromSlice(req.ServerIdentifier().To4())
	return ok && id == s.cfg.ServerIP
}

// proxyOptions: a proxy offer carries no address, our server identifier and the client's
// machine identifier (option 97) back, as the PXE specification asks.
func (s *Server) proxyOptions(_ context.Context, req, resp *dhcpv4.DHCPv4) bool {
	resp.YourIPAddr = net.IPv4zero
	resp.UpdateOption(dhcpv4.OptServerIdentifier(s.cfg.ServerIP.AsSlice()))
	if guid := req.GetOneOption(dhcpv4.OptionClientMachineIdentifier); guid != nil {
		resp.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionClientMachineIdentifier, guid))
	}
	return false
}

// bootOptions writes next-server, boot file and vendor options for a network-boot client.
// required (proxy mode): a client we have nothing for gets no reply at all; in full mode it still
// gets its address.
func (s *Server) bootOptions(required bool) Handler {
	return func(ctx context.Context, req, resp *dhcpv4.DHCPv4) bool {
		if resp.MessageType() == dhcpv4.MessageTypeNak {
			return true
		}
		choice, err := BootFile(req.ClientArch(), req.UserClass(), req.ClassIdentifier(), s.cfg.Boot)
		if err != nil {
			if !errors.Is(err, ErrNotNetboot) {
				s.quiet.Log(ctx, s.log, slog.LevelInfo, s.now(), "not served", "network-boot client not served",
					"mac", req.ClientHWAddr.String(), "err", err)
			}
			if required {
				why := UnansweredNoBinary
				if errors.Is(err, ErrNotNetboot) {
					why = UnansweredNotNetboot
				}
				return drop(ctx, resp, why)
			}
			return false
		}
		var file string
		switch choice.Method {
		case MethodScript:
			file = s.cfg.HTTPBaseURL + netboot.ScriptPath + "?" + netboot.ScriptQuery
		case MethodHTTP:
			file = s.cfg.HTTPBaseURL + netboot.BinaryPath + choice.Binary
		case MethodTFTP:
			file = choice.Binary
			resp.ServerIPAddr = s.cfg.ServerIP.AsSlice()
		}
		setBootFile(resp, file)
		if choice.VendorClass != "" {
			resp.UpdateOption(dhcpv4.OptClassIdentifier(choice.VendorClass))
		}
		if choice.Method == MethodScript && !required {
			// Full mode: we are the only DHCP server iPXE needs. Without this, iPXE waits for
			// ProxyDHCP offers (about 2 s, when the offer lacks option 60 "PXEClient") or, as the
			// offer echoes it, sends a ProxyDHCP request to port 4011, which full mode does not
			// serve, and waits about 2 s for that instead.
			resp.UpdateOption(dhcpv4.OptGeneric(optionIPXEEncap, ipxeNoPXEDHCP))
		}
		if choice.Method == MethodTFTP && choice.VendorClass == VendorPXEClient {
			// PXE discovery control: no boot server discovery, boot the file in this packet.
			resp.UpdateOption(dhcpv4.OptGeneric(dhcpv4.OptionVendorSpecificInformation, []byte{6, 1, 8, 255}))
		}
		return false
	}
}

// iPXE's encapsulated options (option 175): no-pxedhcp (176) = 1 tells iPXE to skip ProxyDHCP.
var (
	optionIPXEEncap = dhcpv4.GenericOptionCode(175)
	ipxeNoPXEDHCP   = []byte{176, 1, 1}
)

// setBootFile puts name in the BOOTP file field when it fits (128 bytes with the NUL), and in
// option 67 otherwise.
func setBootFile(resp *dhcpv4.DHCPv4, name string) {
	if len(name) < 128 {
		resp.BootFileName = name
		return
	}
	resp.UpdateOption(dhcpv4.OptBootFileName(name))
}

// forUs drops full-mode REQUESTs that name another server (the client chose its offer).
func (s *Server) forUs(ctx context.Context, req, resp *dhcpv4.DHCPv4) bool {
	if req.MessageType() == dhcpv4.MessageTypeRequest && req.ServerIdentifier() != nil && !s.isOurServerID(req) {
		return drop(ctx, resp, UnansweredOtherServer)
	}
	return false
}

// poolFor selects the pool: the relay's subnet for relayed packets; else the subnet of ciaddr
// when a pool has it (a client renewing, releasing or informing unicasts straight to us,
// without giaddr, also from behind a relay: RFC 2131 §4.4.5); ours otherwise.
func (s *Server) poolFor(req *dhcpv4.DHCPv4) *Pool {
	if gi, ok := netip.AddrFromSlice(req.GatewayIPAddr.To4()); ok && !gi.IsUnspecified() {
		return s.alloc.poolFor(gi)
	}
	if ci, ok := netip.AddrFromSlice(req.ClientIPAddr.To4()); ok && !ci.IsUnspecified() {
		if p := s.alloc.poolFor(ci); p != nil {
			return p
		}
	}
	return s.alloc.poolFor(s.cfg.ServerIP)
}

// assignAddress is full mode's lease logic: DISCOVER → OFFER, REQUEST → ACK/NAK,
// RELEASE/DECLINE → bookkeeping and no reply, INFORM → ACK without an address.
func (s *Server) assignAddress(ctx context.Context, req, resp *dhcpv4.DHCPv4) bool {
	pool := s.poolFor(req)
	if pool == nil {
		return drop(ctx, resp, UnansweredNoPool)
	}
	mac := req.ClientHWAddr.String()
	now := s.now()
	resp.UpdateOption(dhcpv4.OptServerIdentifier(s.cfg.ServerIP.AsSlice()))
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		var ip netip.Addr
		for attempt := 0; ; attempt++ {
			var fresh, ok bool
			ip, fresh, ok = s.alloc.offer(pool, mac, now)
			if !ok {
				s.quiet.Log(ctx, s.log, slog.LevelWarn, now, "exhausted "+pool.Subnet.String(), "DHCP pool exhausted",
					"pool", pool.Subnet.String(), "mac", mac)
				return drop(ctx, resp, UnansweredPoolExhausted)
			}
			if !fresh || attempt == maxProbes || !s.inUse(ctx, ip, now) {
				break
			}
			s.alloc.drop(mac, ip, now.Add(leaseTime(pool)))
			s.quiet.Log(ctx, s.log, slog.LevelWarn, now, "answers", "DHCP address answers on the network: not offered, held back for a lease time (a lease another server granted?)",
				"ip", ip.String(), "mac", mac)
		}
		resp.YourIPAddr = ip.AsSlice()
		setType(resp, dhcpv4.MessageTypeOffer)
	case dhcpv4.MessageTypeRequest:
		want := req.RequestedIPAddress()
		if want == nil || want.IsUnspecified() {
			want = req.ClientIPAddr // renewing / rebinding
		}
		ip, ok := netip.AddrFromSlice(want.To4())
		if !ok || ip.IsUnspecified() {
			nak(req, resp, "no address requested")
			return true
		}
		granted, err := s.alloc.request(ctx, pool, mac, ip, now)
		if err != nil {
			s.quiet.Log(ctx, s.log, slog.LevelError, now, "persist", "persisting DHCP lease; not acknowledging", "mac", mac, "ip", ip.String(), "err", err)
			return drop(ctx, resp, UnansweredLeaseNotSaved)
		}
		if !granted {
			nak(req, resp, "requested address not available")
			return true
		}
		resp.YourIPAddr = ip.AsSlice()
		setType(resp, dhcpv4.MessageTypeAck)
		if s.cfg.Observe != nil {
			s.cfg.Observe(Binding{MAC: slices.Clone(req.ClientHWAddr), IP: ip, Expires: now.Add(leaseTime(pool))})
		}
	case dhcpv4.MessageTypeRelease, dhcpv4.MessageTypeDecline:
		var err error
		var ip netip.Addr
		var ok bool
		if req.MessageType() == dhcpv4.MessageTypeRelease {
			if ip, ok = netip.AddrFromSlice(req.ClientIPAddr.To4()); ok {
				err = s.alloc.release(ctx, mac, ip)
			}
		} else if ip, ok = netip.AddrFromSlice(req.RequestedIPAddress().To4()); ok {
			err = s.alloc.decline(ctx, mac, ip, now)
		}
		if err != nil {
			s.quiet.Log(ctx, s.log, slog.LevelError, now, "persist change", "persisting DHCP lease change", "mac", mac, "err", err)
		}
		if ok && usableClientAddr(ip) && s.cfg.Observe != nil {
			s.cfg.Observe(Binding{MAC: slices.Clone(req.ClientHWAddr), IP: ip, Released: true})
		}
		return drop(ctx, resp, UnansweredReleased)
	case dhcpv4.MessageTypeInform:
		setType(resp, dhcpv4.MessageTypeAck)
	default:
		return drop(ctx, resp, UnansweredMessageType)
	}
	return false
}

// nak makes resp a NAK saying msg. Relayed, it carries the broadcast bit (RFC 2131 §4.3.2):
// the relay broadcasts it on the client's segment, as the client has no address it could be
// unicast to.
func nak(req, resp *dhcpv4.DHCPv4, msg string) {
	setType(resp, dhcpv4.MessageTypeNak)
	resp.UpdateOption(dhcpv4.OptMessage(msg))
	if gi := req.GatewayIPAddr.To4(); gi != nil && !gi.IsUnspecified() {
		resp.SetBroadcast()
	}
}

// maxProbes bounds the addresses one DISCOVER probes before it offers the next without asking.
const maxProbes = 4

// inUse asks Config.Probe, while probing lasts, whether ip answers on the network. A probe that
// cannot be made counts as no answer (said once in the log).
func (s *Server) inUse(ctx context.Context, ip netip.Addr, now time.Time) bool {
	if s.cfg.Probe == nil || !now.Before(s.probeUntil) {
		return false
	}
	used, err := s.cfg.Probe.InUse(ctx, ip)
	if err != nil {
		if s.probeFailed.CompareAndSwap(false, true) {
			s.log.WarnContext(ctx, "DHCP address probe failed: offering without it", "ip", ip.String(), "err", err)
		}
		return false
	}
	return used
}

// networkOptions adds the pool's mask, router, DNS, domain and lease time.
func (s *Server) networkOptions(_ context.Context, req, resp *dhcpv4.DHCPv4) bool {
	pool := s.poolFor(req)
	resp.UpdateOption(dhcpv4.OptSubnetMask(net.CIDRMask(pool.Subnet.Bits(), 32)))
	if len(pool.Routers) > 0 {
		resp.UpdateOption(dhcpv4.OptRouter(ips(pool.Routers)...))
	}
	if len(pool.DNS) > 0 {
		resp.UpdateOption(dhcpv4.OptDNS(ips(pool.DNS)...))
	}
	if pool.Domain != "" {
		resp.UpdateOption(dhcpv4.OptDomainName(pool.Domain))
	}
	if req.MessageType() != dhcpv4.MessageTypeInform {
		resp.UpdateOption(dhcpv4.OptIPAddressLeaseTime(leaseTime(pool)))
	}
	return false
}

// leaseTime is the pool's lease time; one hour when it sets none.
func leaseTime(p *Pool) time.Duration {
	if p.LeaseTime == 0 {
		return time.Hour
	}
	return p.LeaseTime
}

func ips(as []netip.Addr) []net.IP {
	out := make([]net.IP, len(as))
	for i, a := range as {
		out[i] = a.AsSlice()
	}
	return out
}
