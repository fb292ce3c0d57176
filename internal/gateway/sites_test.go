package gateway_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/pki"
)

// fakeSites records what reaches it: agent a1 holds the lease at epoch 2.
type fakeSites struct {
	mu       sync.Mutex
	callers  []gateway.AgentRef
	readings []gateway.PowerReading
	req      gateway.LeaseRequest
}

func (f *fakeSites) snapshot() (gateway.LeaseRequest, []gateway.PowerReading, []gateway.AgentRef) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.req, append([]gateway.PowerReading(nil), f.readings...), append([]gateway.AgentRef(nil), f.callers...)
}

func (f *fakeSites) note(a gateway.AgentRef) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.callers = append(f.callers, a)
}

func (f *fakeSites) BootLease(_ context.Context, a gateway.AgentRef, req gateway.LeaseRequest) (gateway.LeaseGrant, error) {
	f.note(a)
	f.mu.Lock()
	f.req = req
	f.mu.Unlock()
	if a.AgentID != "a1" {
		return gateway.LeaseGrant{Holder: "a1", Epoch: 2}, nil
	}
	return gateway.LeaseGrant{Held: true, Holder: "a1", Epoch: 2, TTL: req.TTL, Revision: 9, Full: true,
		Entries:    []gateway.BootEntry{{NodeID: "n1", Kind: "ramdisk", MACs: []string{"52:54:00:00:00:01"}, Token: "bcdd_token"}},
		DHCPLeases: []gateway.DHCPLease{{MAC: "52:54:00:00:00:09", IP: netip.MustParseAddr("10.0.0.9"), Expires: time.UnixMilli(5000).UTC()}}}, nil
}

func (f *fakeSites) PollSet(_ context.Context, a gateway.AgentRef, epoch uint64) ([]gateway.PollTarget, time.Duration, error) {
	f.note(a)
	if a.AgentID != "a1" || epoch != 2 {
		return nil, 0, gateway.ErrNotHolder
	}
	return []gateway.PollTarget{{NodeID: "n1", Driver: "ipmi", Address: "10.0.0.1:623", CredentialsJWE: "jwe"}}, time.Minute, nil
}

func (f *fakeSites) ReportPower(_ context.Context, a gateway.AgentRef, epoch uint64, rs []gateway.PowerReading) error {
	f.note(a)
	if a.AgentID != "a1" || epoch != 2 {
		return errors.New("store down")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readings = append(f.readings, rs...)
	return nil
}

func certFor(t *testing.T, env *gatewaytest.Env, issue func(der []byte) ([]byte, error)) tls.Certificate {
	t.Helper()
	key, der := csr(t)
	cert, err := issue(der)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{cert}, PrivateKey: crypto.Signer(key)}
}

// The site calls: only site agents reach Sites, with their certificate's identity; a refusal
// for not holding the lease is FAILED_PRECONDITION; other errors carry no detail; a gateway
// without Sites answers UNIMPLEMENTED.
func TestSiteCalls(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	sites := &fakeSites{}
	env := gatewaytest.Start(t, gateway.Config{Sites: sites})
	ctx := context.Background()
	holder := rawClient(t, env, certFor(t, env, func(der []byte) ([]byte, error) { return env.CA.IssueSiteAgent(der, "s1", "a1", time.Hour, time.Now()) }))
	other := rawClient(t, env, certFor(t, env, func(der []byte) ([]byte, error) { return env.CA.IssueSiteAgent(der, "s1", "a2", time.Hour, time.Now()) }))
	env.Identities.SetGeneration("n1", 1)
	node := rawClient(t, env, certFor(t, env, func(der []byte) ([]byte, error) { return env.CA.IssueNode(der, "n1", 1, time.Hour, time.Now()) }))
	anon := rawClient(t, env, tls.Certificate{})

	res, err := holder.BootLease(ctx, connect.NewRequest(&agentv1.BootLeaseRequest{TtlMs: 5000, Epoch: 1, KnownEntriesRevision: 3,
		DhcpLeases: []*agentv1.DHCPLease{{Mac: "52:54:00:AA:00:01", Ip: "10.0.0.7", ExpiresUnixMs: 7000}, {Mac: "52:54:00:aa:00:02", Ip: "10.0.0.8"}}}))
	if err != nil {
		t.Fatal(err)
	}
	if m := res.Msg; !m.GetHeld() || m.GetEpoch() != 2 || m.GetTtlMs() != 5000 || !m.GetEntriesFull() || m.GetEntriesRevision() != 9 ||
		len(m.GetEntries()) != 1 || m.GetEntries()[0].GetToken() != "bcdd_token" ||
		len(m.GetDhcpLeases()) != 1 || m.GetDhcpLeases()[0].GetIp() != "10.0.0.9" || m.GetDhcpLeases()[0].GetExpiresUnixMs() != 5000 {
		t.Errorf("holder's lease answer %v", m)
	}
	wantLeases := []gateway.DHCPLease{{MAC: "52:54:00:aa:00:01", IP: netip.MustParseAddr("10.0.0.7"), Expires: time.UnixMilli(7000).UTC()},
		{MAC: "52:54:00:aa:00:02", IP: netip.MustParseAddr("10.0.0.8")}}
	if req, _, _ := sites.snapshot(); req.TTL != 5*time.Second || req.Epoch != 1 || req.KnownRevision != 3 || req.Release || !slices.Equal(req.DHCPLeases, wantLeases) {
		t.Errorf("request reached Sites as %+v", req)
	}
	// Malformed leases are refused before they reach Sites, saying what is accepted.
	_, _, before := sites.snapshot()
	for _, bad := range [][]*agentv1.DHCPLease{
		{{Mac: "52:54:00:aa:00", Ip: "10.0.0.7"}},
		{{Mac: "52:54:00:aa:00:01", Ip: "fd00::7"}},
		{{Mac: "52:54:00:aa:00:01", Ip: "10.0.0.256"}},
		make([]*agentv1.DHCPLease, gateway.MaxDHCPLeases+1),
	} {
		_, err := holder.BootLease(ctx, connect.NewRequest(&agentv1.BootLeaseRequest{TtlMs: 5000, Epoch: 2, DhcpLeases: bad}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "accepted") {
			t.Errorf("malformed leases: %v, want invalid_argument naming what is accepted", err)
		}
	}
	if _, _, after := sites.snapshot(); len(after) != len(before) {
		t.Error("malformed leases reached Sites")
	}
	if res, err := other.BootLease(ctx, connect.NewRequest(&agentv1.BootLeaseRequest{TtlMs: 5000})); err != nil || res.Msg.GetHeld() || len(res.Msg.GetEntries()) != 0 {
		t.Errorf("standby's lease answer %v, %v", res, err)
	}
	ps, err := holder.PollSet(ctx, connect.NewRequest(&agentv1.PollSetRequest{Epoch: 2}))
	if err != nil || len(ps.Msg.GetTargets()) != 1 || ps.Msg.GetTargets()[0].GetCredentialsJwe() != "jwe" || ps.Msg.GetRefreshMs() != 60000 {
		t.Errorf("poll set %v, %v", ps, err)
	}
	if _, err := other.PollSet(ctx, connect.NewRequest(&agentv1.PollSetRequest{Epoch: 2})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("standby's poll set: %v, want failed_precondition", err)
	}
	if _, err := holder.ReportPower(ctx, connect.NewRequest(&agentv1.ReportPowerRequest{Epoch: 2, Readings: []*agentv1.PowerReading{
		{NodeId: "n1", Power: "on", ObservedUnixMs: 1000}, {NodeId: "n2", Error: "timeout", Failures: 3}}})); err != nil {
		t.Fatal(err)
	}
	if _, readings, _ := sites.snapshot(); len(readings) != 2 || readings[1].Failures != 3 || readings[0].Observed.UnixMilli() != 1000 {
		t.Errorf("readings reached Sites as %+v", readings)
	}
	_, err = other.ReportPower(ctx, connect.NewRequest(&agentv1.ReportPowerRequest{Epoch: 2}))
	if connect.CodeOf(err) != connect.CodeUnavailable || errors.Is(err, gateway.ErrNotHolder) || strings.Contains(fmt.Sprint(err), "store down") {
		t.Errorf("a store error reached the agent as %v", err)
	}
	_, _, before = sites.snapshot()
	n := len(before)
	for name, c := range map[string]func() error{
		"node lease": func() error {
			_, err := node.BootLease(ctx, connect.NewRequest(&agentv1.BootLeaseRequest{}))
			return err
		},
		"node poll": func() error { _, err := node.PollSet(ctx, connect.NewRequest(&agentv1.PollSetRequest{})); return err },
		"node power": func() error {
			_, err := node.ReportPower(ctx, connect.NewRequest(&agentv1.ReportPowerRequest{}))
			return err
		},
	} {
		if err := c(); connect.CodeOf(err) != connect.CodePermissionDenied {
			t.Errorf("%s: %v, want permission_denied", name, err)
		}
	}
	if _, err := anon.BootLease(ctx, connect.NewRequest(&agentv1.BootLeaseRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("no certificate: %v, want unauthenticated", err)
	}
	_, _, callers := sites.snapshot()
	if len(callers) != n {
		t.Errorf("refused callers reached Sites: %v", callers[n:])
	}
	for _, c := range callers {
		if c.Kind != pki.KindSiteAgent || c.SiteID != "s1" {
			t.Errorf("caller %+v", c)
		}
	}

	// A gateway without Sites.
	bare := start(t)
	c := rawClient(t, bare, certFor(t, bare, func(der []byte) ([]byte, error) {
		return bare.CA.IssueSiteAgent(der, "s1", "a1", time.Hour, time.Now())
	}))
	if _, err := c.BootLease(ctx, connect.NewRequest(&agentv1.BootLeaseRequest{})); connect.CodeOf(err) != connect.CodeUnimplemented {
		t.Errorf("without Sites: %v, want unimplemented", err)
	}
}
