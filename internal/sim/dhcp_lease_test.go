package sim

import (
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/gateway"
	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// bootLease asks for the harness site's boot lease as agent.
func bootLease(t *testing.T, h *Harness, agent string, req engine.LeaseRequest) engine.LeaseGrant {
	t.Helper()
	g, err := h.Engine.BootLease(context.Background(), engine.Agent{ID: agent, Kind: "site", SiteID: h.SiteID}, req)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestDHCPLeasesFollowTheLease: the full-mode DHCP leases a site's boot-lease holder reports
// with its renewals are given to the next holder when it takes the lease, so that its DHCP does
// not hand out an address in use. Only a holder that held all along is listened to; ended and
// expired leases are not passed on, and an address given to another MAC replaces the old lease.
func TestDHCPLeasesFollowTheLease(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		h, _ := start(t, st, 1)
		lease := func(agent string, req engine.LeaseRequest) engine.LeaseGrant { return bootLease(t, h, agent, req) }
		hour := time.Now().Add(time.Hour).UnixMicro()
		l := func(mac, ip string, exp int64) store.DHCPLease {
			return store.DHCPLease{MAC: mac, IP: ip, Expires: exp}
		}

		a := lease("site-a", engine.LeaseRequest{})
		if !a.Held || !a.Full || len(a.DHCPLeases) != 0 {
			t.Fatalf("site-a's first grant: %+v", a)
		}
		// Reported at the first grant's epoch: kept.
		lease("site-a", engine.LeaseRequest{Epoch: a.Epoch, KnownRevision: a.Revision, DHCPLeases: []store.DHCPLease{
			l("52:54:00:00:00:01", "10.0.0.10", hour), l("52:54:00:00:00:02", "10.0.0.11", hour), l("52:54:00:00:00:04", "10.0.0.13", hour)}})
		// m2 gave its address back, m3 took it; m4's lease is reported already over.
		lease("site-a", engine.LeaseRequest{Epoch: a.Epoch, KnownRevision: a.Revision, DHCPLeases: []store.DHCPLease{
			l("52:54:00:00:00:02", "10.0.0.11", 0), l("52:54:00:00:00:03", "10.0.0.11", hour),
			l("52:54:00:00:00:04", "10.0.0.13", time.Now().Add(-time.Second).UnixMicro())}})
		// A standby's report, and one naming no epoch, are not listened to.
		if g := lease("site-b", engine.LeaseRequest{Epoch: a.Epoch, DHCPLeases: []store.DHCPLease{l("52:54:00:00:00:09", "10.0.0.10", hour)}}); g.Held {
			t.Fatalf("site-b took a held lease: %+v", g)
		}
		lease("site-a", engine.LeaseRequest{Release: true})
		b := lease("site-b", engine.LeaseRequest{})
		want := []store.DHCPLease{l("52:54:00:00:00:01", "10.0.0.10", hour), l("52:54:00:00:00:03", "10.0.0.11", hour)}
		if !b.Held || !b.Full || !slices.Equal(b.DHCPLeases, want) {
			t.Fatalf("site-b took the lease with %+v\nwant %+v", b.DHCPLeases, want)
		}
		// Only a grant that hands over the table carries the leases.
		if g := lease("site-b", engine.LeaseRequest{Epoch: b.Epoch, KnownRevision: b.Revision}); g.Full || len(g.DHCPLeases) != 0 {
			t.Fatalf("site-b's renewal: %+v", g)
		}
		// site-a, no longer the holder, reports what it granted before: not kept.
		lease("site-a", engine.LeaseRequest{Epoch: a.Epoch, DHCPLeases: []store.DHCPLease{l("52:54:00:00:00:05", "10.0.0.20", hour)}})
		lease("site-b", engine.LeaseRequest{Release: true})
		if c := lease("site-c", engine.LeaseRequest{}); !c.Held || !slices.Equal(c.DHCPLeases, want) {
			t.Fatalf("site-c took the lease with %+v\nwant %+v", c.DHCPLeases, want)
		}
	})
}

// TestWithheldBootsBecomeEvents: a site agent's report of boot scripts its binding withheld
// becomes one site.boot_withheld event per MAC, address and episode, naming the MAC's node (of
// its own site only); the same episode reported again, as every status repeats it, records
// nothing more.
func TestWithheldBootsBecomeEvents(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, ids := start(t, st, 1)
		m := h.Sim.Machine(ids[0])
		agent := gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: h.SiteID, AgentID: "site-a"}
		gw := h.Engine.Gateway()
		t0 := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
		ours := gateway.WithheldBoot{MAC: m.MACs[0], Remote: netip.MustParseAddr("10.0.0.66"), Count: 2, First: t0, Last: t0.Add(10 * time.Second)}
		stranger := gateway.WithheldBoot{MAC: "52:54:00:ee:ee:ee", Remote: netip.MustParseAddr("10.0.0.67"), Count: 1, First: t0, Last: t0}
		report := func(ws ...gateway.WithheldBoot) {
			t.Helper()
			if err := gw.Status(ctx, agent, gateway.Status{HoldsBootLease: true, Withheld: ws}); err != nil {
				t.Fatal(err)
			}
		}
		withheldEvents := func() []store.Event {
			t.Helper()
			evs, err := st.Events(ctx, store.EventFilter{Limit: 100000})
			if err != nil {
				t.Fatal(err)
			}
			var out []store.Event
			for _, e := range evs {
				if e.Kind == "site.boot_withheld" {
					out = append(out, e)
				}
			}
			return out
		}
		report(ours, stranger)
		ours.Count, ours.Last = 5, t0.Add(30*time.Second)
		report(ours, stranger) // the same episodes, again
		evs := withheldEvents()
		if len(evs) != 2 {
			t.Fatalf("%d events, want one per episode: %+v", len(evs), evs)
		}
		byMAC := map[string]store.Event{}
		for _, e := range evs {
			var d map[string]any
			if err := json.Unmarshal([]byte(e.Data), &d); err != nil {
				t.Fatal(err)
			}
			byMAC[d["mac"].(string)] = e
			if d["remote"] == "" || d["site"] != h.SiteID || d["agent"] != "site-a" || e.Actor != "site:site-a" || e.TenantID != "" {
				t.Errorf("event %+v", e)
			}
		}
		if byMAC[m.MACs[0]].NodeID != ids[0] || byMAC["52:54:00:ee:ee:ee"].NodeID != "" || !strings.Contains(byMAC[m.MACs[0]].Reason, "10.0.0.66") {
			t.Fatalf("events by MAC %+v", byMAC)
		}
		// A new episode of the same pair is a new event.
		ours.First, ours.Count = t0.Add(time.Hour), 1
		report(ours)
		if n := len(withheldEvents()); n != 3 {
			t.Fatalf("%d events after a new episode, want 3", n)
		}
		// Another site's agent reporting this node's MAC reaches no node of another site.
		other := gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: "another-site", AgentID: "site-z"}
		if err := gw.Status(ctx, other, gateway.Status{Withheld: []gateway.WithheldBoot{{MAC: m.MACs[0], Remote: netip.MustParseAddr("10.9.0.1"), Count: 1, First: t0, Last: t0}}}); err != nil {
			t.Fatal(err)
		}
		for _, e := range withheldEvents() {
			if e.Actor == "site:site-z" && e.NodeID != "" {
				t.Fatalf("another site's agent recorded an event on node %s", e.NodeID)
			}
		}
	})
}

// TestBootServicesRecorded: a site agent's status facts give its row the DHCP mode and boot
// binding bcd doctor shows; a value the server does not know is kept as "unknown".
func TestBootServicesRecorded(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, _ := start(t, st, 0)
		if err := h.Engine.Connected(ctx, engine.Agent{ID: "site-a", Kind: "site", SiteID: h.SiteID, ConnID: "c1"}, "t"); err != nil {
			t.Fatal(err)
		}
		ref := gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: h.SiteID, AgentID: "site-a"}
		row := func() store.Agent {
			t.Helper()
			as, err := st.SiteAgents(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range as {
				if a.ID == "site-a" {
					return a
				}
			}
			t.Fatalf("no row for site-a in %+v", as)
			return store.Agent{}
		}
		for _, tc := range []struct{ dhcp, binding, wantDHCP, wantBinding string }{
			{"proxy", "lease", "proxy", "lease"},
			{"off", "none", "off", "none"},
			{"<script>", "maybe", "unknown", "unknown"},
		} {
			if err := h.Engine.Gateway().Status(ctx, ref, gateway.Status{Facts: map[string]string{"dhcp": tc.dhcp, "bootBinding": tc.binding}}); err != nil {
				t.Fatal(err)
			}
			if a := row(); a.DHCPMode != tc.wantDHCP || a.BootBinding != tc.wantBinding {
				t.Errorf("reported %q/%q: stored %q/%q, want %q/%q", tc.dhcp, tc.binding, a.DHCPMode, a.BootBinding, tc.wantDHCP, tc.wantBinding)
			}
		}
	})
}
