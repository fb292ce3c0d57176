package engine

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/store"
)

var _ gateway.Sites = (*Gateway)(nil)

func notHolder(err error) error {
	if errors.Is(err, ErrNotHolder) {
		return fmt.Errorf("%w: %v", gateway.ErrNotHolder, err)
	}
	return err
}

// BootLease implements gateway.Sites.
func (g *Gateway) BootLease(ctx context.Context, a gateway.AgentRef, req gateway.LeaseRequest) (gateway.LeaseGrant, error) {
	in := LeaseRequest{Release: req.Release, TTL: req.TTL, Epoch: req.Epoch, KnownRevision: req.KnownRevision}
	for _, l := range req.DHCPLeases {
		var exp int64
		if !l.Expires.IsZero() {
			exp = l.Expires.UnixMicro()
		}
		in.DHCPLeases = append(in.DHCPLeases, store.DHCPLease{MAC: l.MAC, IP: l.IP.String(), Expires: exp})
	}
	lg, err := g.e.BootLease(ctx, g.agent(ctx, a), in)
	if err != nil {
		return gateway.LeaseGrant{}, err
	}
	out := gateway.LeaseGrant{Held: lg.Held, Holder: lg.Holder, Epoch: lg.Epoch, TTL: lg.TTL, Revision: lg.Revision, Full: lg.Full, Rejected: lg.Rejected}
	for _, l := range lg.DHCPLeases {
		if ip, err := netip.ParseAddr(l.IP); err == nil {
			out.DHCPLeases = append(out.DHCPLeases, gateway.DHCPLease{MAC: l.MAC, IP: ip, Expires: time.UnixMicro(l.Expires).UTC()})
		}
	}
	for _, e := range lg.Entries {
		be := gateway.BootEntry{NodeID: e.NodeID, Kind: e.Kind, MACs: e.MACs, Token: e.Token, Local: e.Local, UserData: e.UserData, UserDataSHA256: e.UserDataSHA256}
		if e.ISO != nil {
			be.ISOName, be.ISOURL, be.ISOSHA256 = e.ISO.Name, e.ISO.URL, e.ISO.SHA256
		}
		out.Entries = append(out.Entries, be)
	}
	return out, nil
}

// PollSet implements gateway.Sites.
func (g *Gateway) PollSet(ctx context.Context, a gateway.AgentRef, epoch uint64) ([]gateway.PollTarget, time.Duration, error) {
	ts, refresh, err := g.e.PollSet(ctx, g.agent(ctx, a), epoch)
	if err != nil {
		return nil, 0, notHolder(err)
	}
	out := make([]gateway.PollTarget, len(ts))
	for i, t := range ts {
		out[i] = gateway.PollTarget{NodeID: t.NodeID, Driver: t.BMC.Driver, Address: t.BMC.Address, InsecureTLS: t.BMC.InsecureTLS,
			FingerprintSHA256: t.BMC.FingerprintSHA256, CredentialsJWE: t.Credentials}
	}
	return out, refresh, nil
}

// ReportPower implements gateway.Sites.
func (g *Gateway) ReportPower(ctx context.Context, a gateway.AgentRef, epoch uint64, rs []gateway.PowerReading) error {
	in := make([]PowerReading, len(rs))
	for i, r := range rs {
		in[i] = PowerReading{NodeID: r.NodeID, Power: r.Power, Error: r.Error, Failures: r.Failures, Observed: r.Observed}
	}
	return notHolder(g.e.ReportPower(ctx, g.agent(ctx, a), epoch, in))
}
