package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"connectrpc.com/connect"

	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/pki"
)

// Sites is what the gateway's BootLease, PollSet and ReportPower calls need of the control
// plane: the site's boot lease with the entries its holder is given, and power polling. Every
// method is called with the site agent's verified identity.
type Sites interface {
	BootLease(ctx context.Context, a AgentRef, req LeaseRequest) (LeaseGrant, error)
	// PollSet errs with ErrNotHolder (wrapped) when a does not hold the lease at epoch.
	PollSet(ctx context.Context, a AgentRef, epoch uint64) (targets []PollTarget, refresh time.Duration, err error)
	// ReportPower errs with ErrNotHolder (wrapped) when a does not hold the lease at epoch.
	ReportPower(ctx context.Context, a AgentRef, epoch uint64, readings []PowerReading) error
}

// ErrNotHolder: Sites returns it (wrapped) to an agent that does not hold its site's boot lease
// at the epoch it names; the agent is told FAILED_PRECONDITION.
const ErrNotHolder Error = "not the boot-lease holder"

// ErrAgentRevoked: an operator revoked the site agent's certificate (bcd site revoke-agent).
const ErrAgentRevoked Error = "the site agent's certificate was revoked"

// LeaseRequest is a site agent's acquire, renewal or release of its site's boot lease.
type LeaseRequest struct {
	Release       bool
	TTL           time.Duration
	Epoch         uint64
	KnownRevision uint64
	// DHCPLeases: the holder's full-mode DHCP leases granted or ended (Expires zero) since its
	// last answered renewal. Validated: MAC and IPv4 address well formed, at most MaxDHCPLeases.
	DHCPLeases []DHCPLease
}

// DHCPLease is an address a site agent's DHCP leased to a MAC until Expires (zero: ended).
type DHCPLease struct {
	MAC     string // lower case, colon-separated
	IP      netip.Addr
	Expires time.Time
}

// MaxDHCPLeases bounds the leases one BootLease request or answer carries.
const MaxDHCPLeases = 4096

// BootEntry is a boot entry pushed to the lease holder.
type BootEntry struct {
	NodeID, Kind string
	MACs         []string
	Token, Local string
	// The ISO of a sanboot entry.
	ISOName, ISOURL, ISOSHA256 string
	// An instance entry's operator user-data: a compact JWE to the receiving agent (relayed,
	// never opened here), and its hex SHA-256; "" when none.
	UserData, UserDataSHA256 string
}

// LeaseGrant answers a LeaseRequest.
type LeaseGrant struct {
	Held     bool
	Holder   string
	Epoch    uint64
	TTL      time.Duration
	Revision uint64
	Full     bool
	Entries  []BootEntry
	Rejected []string // MACs an operator rejected (acceptance flow)
	// DHCPLeases: with Full, the site's DHCP leases that still run.
	DHCPLeases []DHCPLease
}

// PollTarget is a node the holder polls.
type PollTarget struct {
	NodeID, Driver, Address string
	InsecureTLS             bool
	FingerprintSHA256       string
	CredentialsJWE          string
}

// PowerReading is one power read by the holder's poller.
type PowerReading struct {
	NodeID, Power, Error string
	Failures             int
	Observed             time.Time
}

// siteAgent admits only site agents to the site calls.
func (s *Server) siteAgent(ctx context.Context) (AgentRef, error) {
	if s.cfg.Sites == nil {
		return AgentRef{}, connect.NewError(connect.CodeUnimplemented, errors.New("this control plane keeps no boot lease"))
	}
	return s.admitSiteAgent(ctx)
}

// admitSiteAgent admits the caller only if it is a site agent not revoked.
func (s *Server) admitSiteAgent(ctx context.Context) (AgentRef, error) {
	id, err := s.peerIdentity(ctx)
	if err != nil {
		return AgentRef{}, err
	}
	if id.Kind != pki.KindSiteAgent {
		return AgentRef{}, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("a %s certificate is not a site agent's", id.Kind))
	}
	if err := s.siteAgentAllowed(ctx, id); err != nil {
		return AgentRef{}, err
	}
	return RefOf(id), nil
}

// siteError maps a Sites error for the agent: not-holder is a precondition, the rest is logged
// and reported without detail.
func (s *Server) siteError(ctx context.Context, what string, a AgentRef, err error) error {
	if errors.Is(err, ErrNotHolder) {
		return connect.NewError(connect.CodeFailedPrecondition, ErrNotHolder)
	}
	s.cfg.Logger.LogAttrs(ctx, slog.LevelError, what, slog.String("agent", a.String()), slog.Any("error", err))
	return connect.NewError(connect.CodeUnavailable, fmt.Errorf("%s failed; try again", what))
}

// BootLease implements bcd.agent.v1.GatewayService.
func (s *Server) BootLease(ctx context.Context, req *connect.Request[agentv1.BootLeaseRequest]) (*connect.Response[agentv1.BootLeaseResponse], error) {
	a, err := s.siteAgent(ctx)
	if err != nil {
		return nil, err
	}
	m := req.Msg
	leases, err := DHCPLeasesFromProto(m.GetDhcpLeases())
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	g, err := s.cfg.Sites.BootLease(ctx, a, LeaseRequest{Release: m.GetRelease(), TTL: time.Duration(m.GetTtlMs()) * time.Millisecond,
		Epoch: m.GetEpoch(), KnownRevision: m.GetKnownEntriesRevision(), DHCPLeases: leases})
	if err != nil {
		return nil, s.siteError(ctx, "boot lease", a, err)
	}
	out := &agentv1.BootLeaseResponse{Held: g.Held, HolderAgentId: g.Holder, Epoch: g.Epoch, TtlMs: g.TTL.Milliseconds(),
		EntriesRevision: g.Revision, EntriesFull: g.Full, RejectedMacs: g.Rejected, DhcpLeases: DHCPLeasesToProto(g.DHCPLeases)}
	for _, e := range g.Entries {
		out.Entries = append(out.Entries, &agentv1.BootEntry{NodeId: e.NodeID, Kind: e.Kind, Macs: e.MACs, Token: e.Token, Local: e.Local,
			IsoName: e.ISOName, IsoUrl: e.ISOURL, IsoSha256: e.ISOSHA256, UserData: e.UserData, UserDataSha256: e.UserDataSHA256})
	}
	return connect.NewResponse(out), nil
}

// DHCPLeasesFromProto validates leases from the wire: at most MaxDHCPLeases, each with a
// 6-octet MAC (returned in lower case) and an IPv4 address; a zero or negative expiry is an
// ended lease.
func DHCPLeasesFromProto(in []*agentv1.DHCPLease) ([]DHCPLease, error) {
	if len(in) > MaxDHCPLeases {
		return nil, fmt.Errorf("%d DHCP leases in one request: at most %d are accepted", len(in), MaxDHCPLeases)
	}
	out := make([]DHCPLease, 0, len(in))
	for i, l := range in {
		mac, err := net.ParseMAC(l.GetMac())
		if err != nil || len(mac) != 6 {
			return nil, fmt.Errorf("DHCP lease %d: MAC %q: accepted is a 6-octet MAC such as 52:54:00:12:34:56", i, l.GetMac())
		}
		ip, err := netip.ParseAddr(l.GetIp())
		if err != nil || !ip.Is4() {
			return nil, fmt.Errorf("DHCP lease %d: address %q: accepted is an IPv4 address", i, l.GetIp())
		}
		var exp time.Time
		if ms := l.GetExpiresUnixMs(); ms > 0 {
			exp = time.UnixMilli(ms).UTC()
		}
		out = append(out, DHCPLease{MAC: mac.String(), IP: ip, Expires: exp})
	}
	return out, nil
}

// DHCPLeasesToProto is the wire form of leases.
func DHCPLeasesToProto(ls []DHCPLease) []*agentv1.DHCPLease {
	out := make([]*agentv1.DHCPLease, 0, len(ls))
	for _, l := range ls {
		var ms int64
		if !l.Expires.IsZero() {
			ms = l.Expires.UnixMilli()
		}
		out = append(out, &agentv1.DHCPLease{Mac: l.MAC, Ip: l.IP.String(), ExpiresUnixMs: ms})
	}
	return out
}

// PollSet implements bcd.agent.v1.GatewayService.
func (s *Server) PollSet(ctx context.Context, req *connect.Request[agentv1.PollSetRequest]) (*connect.Response[agentv1.PollSetResponse], error) {
	a, err := s.siteAgent(ctx)
	if err != nil {
		return nil, err
	}
	ts, refresh, err := s.cfg.Sites.PollSet(ctx, a, req.Msg.GetEpoch())
	if err != nil {
		return nil, s.siteError(ctx, "poll set", a, err)
	}
	out := &agentv1.PollSetResponse{RefreshMs: refresh.Milliseconds(), Targets: make([]*agentv1.PollTarget, 0, len(ts))}
	for _, t := range ts {
		out.Targets = append(out.Targets, &agentv1.PollTarget{NodeId: t.NodeID, Driver: t.Driver, Address: t.Address,
			InsecureTls: t.InsecureTLS, FingerprintSha256: t.FingerprintSHA256, CredentialsJwe: t.CredentialsJWE})
	}
	return connect.NewResponse(out), nil
}

// ReportPower implements bcd.agent.v1.GatewayService.
func (s *Server) ReportPower(ctx context.Context, req *connect.Request[agentv1.ReportPowerRequest]) (*connect.Response[agentv1.ReportPowerResponse], error) {
	a, err := s.siteAgent(ctx)
	if err != nil {
		return nil, err
	}
	rs := make([]PowerReading, 0, len(req.Msg.GetReadings()))
	for _, r := range req.Msg.GetReadings() {
		rs = append(rs, PowerReading{NodeID: r.GetNodeId(), Power: r.GetPower(), Error: r.GetError(), Failures: int(r.GetFailures()),
			Observed: time.UnixMilli(r.GetObservedUnixMs())})
	}
	if err := s.cfg.Sites.ReportPower(ctx, a, req.Msg.GetEpoch(), rs); err != nil {
		return nil, s.siteError(ctx, "power report", a, err)
	}
	return connect.NewResponse(&agentv1.ReportPowerResponse{}), nil
}
