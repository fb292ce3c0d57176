package agentlink

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/gateway"
	agentv1 "bcd/internal/gen/agentv1"
)

// Site agents' unary calls beside the stream: the site's boot lease (with the boot entries the
// holder is given) and power polling. They use the link's mTLS client; the gateway identifies
// the agent by its certificate.

const (
	// ErrUnsupported: the gateway keeps no boot lease (an older or embedded control plane).
	ErrUnsupported Error = "not supported by the gateway"
	// ErrNotHolder: the agent does not hold its site's boot lease at the epoch it named.
	ErrNotHolder Error = "not the boot-lease holder"
)

// LeaseRequest acquires, renews or (Release) hands back the site's boot lease.
type LeaseRequest struct {
	Release       bool
	TTL           time.Duration
	Epoch         uint64 // the epoch the agent holds; 0: none
	KnownRevision uint64 // the boot-entry revision the agent applied
	// DHCPLeases: the holder's full-mode leases granted or ended since its last answered
	// renewal (at most gateway.MaxDHCPLeases).
	DHCPLeases []gateway.DHCPLease
}

// BootEntry is a boot entry the control plane gives the lease holder.
type BootEntry struct {
	NodeID string
	Kind   string // ramdisk, instance, sanboot, removed
	MACs   []string
	Token  string // one-time token; never log it
	Local  string
	// The ISO of a sanboot entry (kind sanboot).
	ISOName, ISOURL, ISOSHA256 string
	// An instance entry's operator user-data: a compact JWE to this agent, and its hex SHA-256
	// ("" when none).
	UserData, UserDataSHA256 string
}

// LeaseGrant is the gateway's answer.
type LeaseGrant struct {
	Held     bool
	Holder   string
	Epoch    uint64
	TTL      time.Duration
	Revision uint64
	Full     bool // Entries replace the agent's table
	Entries  []BootEntry
	// Rejected: MACs of machines an operator rejected (acceptance flow); holder only.
	Rejected []string
	// DHCPLeases: with Full, the site's DHCP leases that still run (previous holders').
	DHCPLeases []gateway.DHCPLease
}

// PollTarget is a node whose power the holder polls; CredentialsJWE is encrypted to the agent.
type PollTarget struct {
	NodeID, Driver, Address string
	InsecureTLS             bool
	FingerprintSHA256       string
	CredentialsJWE          string
}

// PowerReading is one read of a node's power.
type PowerReading struct {
	NodeID   string
	Power    string // "" when the read failed
	Error    string
	Failures int
	Observed time.Time
}

func siteCallError(what string, err error) error {
	switch connect.CodeOf(err) {
	case connect.CodeUnimplemented:
		return fmt.Errorf("%s: %w", what, ErrUnsupported)
	case connect.CodeFailedPrecondition:
		return fmt.Errorf("%s: %w", what, ErrNotHolder)
	}
	return fmt.Errorf("%s: %w", what, classify(err))
}

// BootLease calls the gateway's BootLease.
func (l *Link) BootLease(ctx context.Context, req LeaseRequest) (LeaseGrant, error) {
	res, err := l.client().BootLease(ctx, connect.NewRequest(&agentv1.BootLeaseRequest{Release: req.Release, TtlMs: req.TTL.Milliseconds(),
		Epoch: req.Epoch, KnownEntriesRevision: req.KnownRevision, DhcpLeases: gateway.DHCPLeasesToProto(req.DHCPLeases)}))
	if err != nil {
		return LeaseGrant{}, siteCallError("boot lease", err)
	}
	m := res.Msg
	leases, err := gateway.DHCPLeasesFromProto(m.GetDhcpLeases())
	if err != nil {
		return LeaseGrant{}, fmt.Errorf("boot lease: the gateway's answer: %w", err)
	}
	g := LeaseGrant{Held: m.GetHeld(), Holder: m.GetHolderAgentId(), Epoch: m.GetEpoch(), TTL: time.Duration(m.GetTtlMs()) * time.Millisecond,
		Revision: m.GetEntriesRevision(), Full: m.GetEntriesFull(), Rejected: m.GetRejectedMacs(), DHCPLeases: leases}
	for _, e := range m.GetEntries() {
		g.Entries = append(g.Entries, BootEntry{NodeID: e.GetNodeId(), Kind: e.GetKind(), MACs: e.GetMacs(), Token: e.GetToken(), Local: e.GetLocal(),
			ISOName: e.GetIsoName(), ISOURL: e.GetIsoUrl(), ISOSHA256: e.GetIsoSha256(), UserData: e.GetUserData(), UserDataSHA256: e.GetUserDataSha256()})
	}
	return g, nil
}

// PollSet fetches the nodes the holder at epoch polls, and when to ask again.
func (l *Link) PollSet(ctx context.Context, epoch uint64) ([]PollTarget, time.Duration, error) {
	res, err := l.client().PollSet(ctx, connect.NewRequest(&agentv1.PollSetRequest{Epoch: epoch}))
	if err != nil {
		return nil, 0, siteCallError("poll set", err)
	}
	out := make([]PollTarget, 0, len(res.Msg.GetTargets()))
	for _, t := range res.Msg.GetTargets() {
		out = append(out, PollTarget{NodeID: t.GetNodeId(), Driver: t.GetDriver(), Address: t.GetAddress(), InsecureTLS: t.GetInsecureTls(),
			FingerprintSHA256: t.GetFingerprintSha256(), CredentialsJWE: t.GetCredentialsJwe()})
	}
	return out, time.Duration(res.Msg.GetRefreshMs()) * time.Millisecond, nil
}

// ReportPower sends power readings of the holder at epoch.
func (l *Link) ReportPower(ctx context.Context, epoch uint64, rs []PowerReading) error {
	m := &agentv1.ReportPowerRequest{Epoch: epoch, Readings: make([]*agentv1.PowerReading, 0, len(rs))}
	for _, r := range rs {
		m.Readings = append(m.Readings, &agentv1.PowerReading{NodeId: r.NodeID, Power: r.Power, Error: r.Error, Failures: int32(r.Failures),
			ObservedUnixMs: r.Observed.UnixMilli()})
	}
	if _, err := l.client().ReportPower(ctx, connect.NewRequest(m)); err != nil {
		return siteCallError("power report", err)
	}
	return nil
}
