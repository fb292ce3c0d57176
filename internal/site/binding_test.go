package site

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/dhcp"
	"bcd/internal/gateway"
	"bcd/internal/netboot"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

func TestCheckBootBinding(t *testing.T) {
	tests := []struct {
		in     BootBinding
		dhcpOn bool
		want   BootBinding
		err    string
	}{
		{"", true, BindLease, ""},
		{"", false, BindNone, ""},
		{BindLease, true, BindLease, ""},
		{BindNone, true, BindNone, ""},
		{BindNone, false, BindNone, ""},
		{BindLease, false, "", "needs the agent's DHCP"},
		{"mac", true, "", "accepted are lease and none"},
	}
	for _, tc := range tests {
		got, err := checkBootBinding(tc.in, tc.dhcpOn)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q dhcp %t: error %v, want %q", tc.in, tc.dhcpOn, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q dhcp %t: %q %v, want %q", tc.in, tc.dhcpOn, got, err, tc.want)
		}
	}
}

// TestAddrBook: one address per MAC and one MAC per address; a newer binding replaces both
// sides of an older one, a release only its own, expiry ends a binding, and the book is bounded.
func TestAddrBook(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	type op struct {
		unbind  bool
		mac     string
		addr    string
		expires time.Time
	}
	type check struct {
		mac, addr string
		at        time.Time
		holds     bool
	}
	tests := []struct {
		name   string
		ops    []op
		checks []check
	}{
		{"bound until replaced", []op{{mac: "m1", addr: "10.0.0.1"}},
			[]check{{"m1", "10.0.0.1", t0.Add(1000 * time.Hour), true}, {"m1", "10.0.0.2", t0, false}, {"m2", "10.0.0.1", t0, false}}},
		{"IPv4-mapped is the same address", []op{{mac: "m1", addr: "::ffff:10.0.0.1"}},
			[]check{{"m1", "10.0.0.1", t0, true}, {"m1", "::ffff:10.0.0.1", t0, true}}},
		{"a lease ends at its expiry", []op{{mac: "m1", addr: "10.0.0.1", expires: t0.Add(time.Hour)}},
			[]check{{"m1", "10.0.0.1", t0.Add(59 * time.Minute), true}, {"m1", "10.0.0.1", t0.Add(time.Hour), false}}},
		{"a MAC that moves leaves its old address", []op{{mac: "m1", addr: "10.0.0.1"}, {mac: "m1", addr: "10.0.0.2"}},
			[]check{{"m1", "10.0.0.1", t0, false}, {"m1", "10.0.0.2", t0, true}}},
		{"an address taken by another MAC", []op{{mac: "m1", addr: "10.0.0.1"}, {mac: "m2", addr: "10.0.0.1"}},
			[]check{{"m1", "10.0.0.1", t0, false}, {"m2", "10.0.0.1", t0, true}}},
		{"a release unbinds", []op{{mac: "m1", addr: "10.0.0.1"}, {unbind: true, mac: "m1", addr: "10.0.0.1"}},
			[]check{{"m1", "10.0.0.1", t0, false}}},
		{"a stale release leaves the newer binding", []op{{mac: "m1", addr: "10.0.0.1"}, {mac: "m2", addr: "10.0.0.1"}, {unbind: true, mac: "m1", addr: "10.0.0.1"}},
			[]check{{"m2", "10.0.0.1", t0, true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newAddrBook(8)
			for _, o := range tc.ops {
				if o.unbind {
					b.unbind(o.mac, a(o.addr))
				} else {
					b.bind(o.mac, a(o.addr), o.expires)
				}
			}
			for _, c := range tc.checks {
				if got := b.holds(c.mac, a(c.addr), c.at); got != c.holds {
					t.Errorf("%s holds %s at %s: %t, want %t", c.mac, c.addr, c.at.Format(time.TimeOnly), got, c.holds)
				}
			}
			if len(b.byAddr) != len(b.byMAC) {
				t.Errorf("the two sides disagree: %v %v", b.byAddr, b.byMAC)
			}
		})
	}
	t.Run("bounded", func(t *testing.T) {
		b := newAddrBook(4)
		for i := range 10 {
			b.bind(string(rune('a'+i)), netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), time.Time{})
		}
		if len(b.byAddr) != 4 || len(b.byMAC) != 4 || !b.holds("j", a("10.0.0.9"), t0) {
			t.Fatalf("%d / %d bindings, latest kept %t", len(b.byAddr), len(b.byMAC), b.holds("j", a("10.0.0.9"), t0))
		}
	})
}

// TestEntriesBindings: what the DHCP service observes decides where a MAC's script goes
// (BootsFrom) and which node's metadata an address gets.
func TestEntriesBindings(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	e, err := OpenEntries("", "https://gw:8443", nil)
	if err != nil {
		t.Fatal(err)
	}
	e.now = func() time.Time { return now }
	mac, _ := net.ParseMAC("52:54:00:aa:00:01")
	if err := e.SetInstance("n1", []string{mac.String()}, "bcdi_instance-token-0123", nil); err != nil {
		t.Fatal(err)
	}
	ip, other := netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.0.0.8")
	if e.BootsFrom(mac, ip) {
		t.Fatal("bound before the DHCP saw anything")
	}
	e.Observe(dhcp.Binding{MAC: mac, IP: ip, Expires: now.Add(time.Hour)})
	if !e.BootsFrom(mac, ip) || e.BootsFrom(mac, other) {
		t.Fatal("BootsFrom after the lease")
	}
	if doc, ok := e.Metadata(ctx, ip); !ok || !strings.Contains(string(doc), `"nodeId":"n1"`) {
		t.Fatalf("metadata for the leased address: %s %t", doc, ok)
	}
	if _, ok := e.Metadata(ctx, other); ok {
		t.Fatal("metadata for another address")
	}
	now = now.Add(2 * time.Hour)
	if e.BootsFrom(mac, ip) {
		t.Fatal("bound after the lease expired")
	}
	if _, ok := e.Metadata(ctx, ip); ok {
		t.Fatal("metadata after the lease expired")
	}
	e.Observe(dhcp.Binding{MAC: mac, IP: ip}) // proxy mode: until replaced
	e.Observe(dhcp.Binding{MAC: mac, IP: ip, Released: true})
	if e.BootsFrom(mac, ip) {
		t.Fatal("bound after the release")
	}

	// A machine that took its address on its second NIC while its script request names the
	// first (iPXE's net0): the address is its own. Another node's MAC at that address is not.
	nic1, _ := net.ParseMAC("52:54:00:bb:00:01")
	nic2, _ := net.ParseMAC("52:54:00:bb:00:02")
	stranger, _ := net.ParseMAC("52:54:00:cc:00:01")
	ram := netboot.Entry{Kind: netboot.KindLocal, Local: netboot.LocalExit}
	if err := e.Install("n2", []string{nic1.String(), nic2.String()}, ram); err != nil {
		t.Fatal(err)
	}
	if err := e.Install("n3", []string{stranger.String()}, ram); err != nil {
		t.Fatal(err)
	}
	e.Observe(dhcp.Binding{MAC: nic2, IP: other4(ip)})
	if !e.BootsFrom(nic1, other4(ip)) {
		t.Fatal("a node's script withheld from the address its other NIC holds")
	}
	if e.BootsFrom(stranger, other4(ip)) {
		t.Fatal("another node's script served to an address this node holds")
	}
}

// other4 is an address beside ip.
func other4(ip netip.Addr) netip.Addr { return ip.Next().Next() }

// TestGatewayLeaseCarriesDHCPLeases: the holder's DHCP lease changes go with its renewals and
// stay pending until a renewal at the epoch held is answered (a standby, or a grant that hands
// the table over, keeps them for later); a newer change of a MAC made meanwhile stays pending.
// Taking the lease hands the site's known leases to the agent before it serves.
func TestGatewayLeaseCarriesDHCPLeases(t *testing.T) {
	ctx := context.Background()
	f := &fakeLink{}
	g := newGatewayLease(f, func(bool, []agentlink.BootEntry) error { return nil }, slog.New(slog.DiscardHandler))
	g.reports = newDHCPReports()
	var known [][]gateway.DHCPLease
	g.known = func(ls []gateway.DHCPLease) { known = append(known, ls) }
	mac := func(b byte) net.HardwareAddr { return net.HardwareAddr{0x52, 0x54, 0, 0, 0, b} }
	exp := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	last := func() agentlink.LeaseRequest { f.mu.Lock(); defer f.mu.Unlock(); return f.reqs[len(f.reqs)-1] }

	// Proxy-mode bindings are no leases of ours; full-mode grants and releases are.
	g.reports.observe(dhcp.Binding{MAC: mac(1), IP: netip.MustParseAddr("10.0.0.1")})
	g.reports.observe(dhcp.Binding{MAC: mac(2), IP: netip.MustParseAddr("10.0.0.2"), Expires: exp})
	g.reports.observe(dhcp.Binding{MAC: mac(3), IP: netip.MustParseAddr("10.0.0.3"), Released: true})
	if n := g.reports.len(); n != 2 {
		t.Fatalf("%d pending, want 2", n)
	}
	// Not holding (epoch 0): nothing is sent. Taking the lease: the known leases are handed on,
	// the changes stay pending (the grant was no renewal at the epoch held).
	site := []gateway.DHCPLease{{MAC: mac(9).String(), IP: netip.MustParseAddr("10.0.0.9"), Expires: exp}}
	f.grant = agentlink.LeaseGrant{Held: true, Holder: "a", Epoch: 5, Full: true, DHCPLeases: site}
	if held, err := g.Acquire(ctx, "s", "a", 5*time.Second); !held || err != nil {
		t.Fatal(held, err)
	}
	if r := last(); len(r.DHCPLeases) != 0 {
		t.Fatalf("sent %+v without holding", r.DHCPLeases)
	}
	if len(known) != 1 || len(known[0]) != 1 || known[0][0] != site[0] || g.reports.len() != 2 {
		t.Fatalf("known %+v, %d pending", known, g.reports.len())
	}
	// The renewal at epoch 5 carries both (sorted by MAC); answered, they are done.
	f.grant = agentlink.LeaseGrant{Held: true, Holder: "a", Epoch: 5}
	if held, _ := g.Acquire(ctx, "s", "a", 5*time.Second); !held {
		t.Fatal("renewal not held")
	}
	want := []gateway.DHCPLease{{MAC: mac(2).String(), IP: netip.MustParseAddr("10.0.0.2"), Expires: exp}, {MAC: mac(3).String(), IP: netip.MustParseAddr("10.0.0.3")}}
	if r := last(); r.Epoch != 5 || !slices.Equal(r.DHCPLeases, want) {
		t.Fatalf("renewal sent %+v at epoch %d, want %+v", r.DHCPLeases, r.Epoch, want)
	}
	if n := g.reports.len(); n != 0 || len(known) != 1 {
		t.Fatalf("%d pending after the answer; known handed %d times", n, len(known))
	}
	// A failed renewal keeps them; a change that came while a renewal was out stays.
	g.reports.observe(dhcp.Binding{MAC: mac(4), IP: netip.MustParseAddr("10.0.0.4"), Expires: exp})
	f.err = errors.New("gateway down")
	if _, err := g.Acquire(ctx, "s", "a", 5*time.Second); err == nil {
		t.Fatal("no error")
	}
	f.err = nil
	sent := g.reports.take(gateway.MaxDHCPLeases)
	g.reports.observe(dhcp.Binding{MAC: mac(4), IP: netip.MustParseAddr("10.0.0.4"), Expires: exp.Add(time.Hour)})
	g.reports.sent(sent)
	if n := g.reports.len(); n != 1 {
		t.Fatalf("%d pending, want the renewed lease of %s", n, mac(4))
	}
	// take is bounded.
	for i := range 10 {
		g.reports.observe(dhcp.Binding{MAC: net.HardwareAddr{0x52, 0x54, 0, 0, 1, byte(i)}, IP: netip.AddrFrom4([4]byte{10, 0, 1, byte(i)}), Expires: exp})
	}
	if n := len(g.reports.take(4)); n != 4 {
		t.Fatalf("take(4) gave %d", n)
	}
}

// TestAgentDHCPWiring: the agent's DHCP, as it starts (dhcpConfig), holds the site's leases the
// control plane gave it with the boot lease, and what it grants binds the MAC's boot script to
// the address and goes into the lease reports.
func TestAgentDHCPWiring(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pool := dhcp.Pool{Subnet: netip.MustParsePrefix("10.0.0.0/24"), Start: netip.MustParseAddr("10.0.0.100"), End: netip.MustParseAddr("10.0.0.101")}
	a, err := New(Config{GatewayURL: "https://gw:8443", Site: "s", DataDir: t.TempDir(), HTTPListener: ln,
		DHCPMode: dhcp.ModeFull, ServerIP: netip.MustParseAddr("10.0.0.1"), DHCPPools: []dhcp.Pool{pool}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.closeAll()
	if a.cfg.BootBinding != BindLease || a.dhcpReports == nil {
		t.Fatalf("full DHCP: binding %q, reports %v", a.cfg.BootBinding, a.dhcpReports)
	}
	elsewhere := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x09}
	a.setKnownLeases([]gateway.DHCPLease{{MAC: elsewhere.String(), IP: netip.MustParseAddr("10.0.0.100"), Expires: time.Now().Add(time.Hour)}})
	conn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cfg := a.dhcpConfig(slog.New(slog.DiscardHandler))
	cfg.Interface, cfg.Conn, cfg.BroadcastAddr = "", conn, netip.MustParseAddr("127.0.0.1")
	srv, err := dhcp.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ls := srv.Leases(); len(ls) != 1 || ls[0].MAC != elsewhere.String() {
		t.Fatalf("leases at start %+v, want the one known from the site", ls)
	}
	if !a.entries.BootsFrom(elsewhere, netip.MustParseAddr("10.0.0.100")) {
		t.Fatal("the known lease does not bind its MAC's boot script")
	}
	// A new machine gets the other address, bound and reported.
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x01}
	d, _ := dhcpv4.NewDiscovery(mac)
	offer := srv.Handle(ctx, dhcp.ListenerDHCP, d)
	if offer == nil || offer.YourIPAddr.String() != "10.0.0.101" {
		t.Fatalf("offer %v, want 10.0.0.101", offer)
	}
	req, _ := dhcpv4.NewRequestFromOffer(offer)
	if ack := srv.Handle(ctx, dhcp.ListenerDHCP, req); ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
		t.Fatalf("request: %v", ack)
	}
	if !a.entries.BootsFrom(mac, netip.MustParseAddr("10.0.0.101")) {
		t.Fatal("the granted lease does not bind its MAC's boot script")
	}
	if r := a.dhcpReports.take(10); len(r) != 2 || r[0].MAC != mac.String() || r[1].MAC != elsewhere.String() {
		t.Fatalf("reported %+v, want the new lease and the known one", r)
	}
}

// TestWithheldBoots: one pair per MAC and requesting address, counted; a new pair makes a status
// report due, a repeat does not; pairs unseen for withheldKeep leave; the least recently seen
// goes first past maxWithheld.
func TestWithheldBoots(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	pokes := 0
	w := newWithheldBoots(func() { pokes++ })
	mac, _ := net.ParseMAC("52:54:00:aa:00:01")
	a, b := netip.MustParseAddr("10.0.0.66"), netip.MustParseAddr("::ffff:10.0.0.67")
	w.RecordWithheld(mac, a, t0)
	w.RecordWithheld(mac, a, t0.Add(10*time.Second))
	w.RecordWithheld(mac, b, t0.Add(20*time.Second))
	got := w.Snapshot(t0.Add(30 * time.Second))
	if pokes != 2 || len(got) != 2 || got[0].Count != 2 || !got[0].First.Equal(t0) || !got[0].Last.Equal(t0.Add(10*time.Second)) ||
		got[1].Remote != netip.MustParseAddr("10.0.0.67") || got[1].Count != 1 {
		t.Fatalf("%d pokes, %+v", pokes, got)
	}
	if got := w.Snapshot(t0.Add(10*time.Second + withheldKeep)); len(got) != 1 || got[0].Remote != netip.MustParseAddr("10.0.0.67") {
		t.Fatalf("after the first pair's keep: %+v", got)
	}
	// A pair back after it left is a new episode.
	w.RecordWithheld(mac, a, t0.Add(time.Hour))
	if got := w.Snapshot(t0.Add(time.Hour)); len(got) != 1 || !got[0].First.Equal(t0.Add(time.Hour)) || got[0].Count != 1 || pokes != 3 {
		t.Fatalf("new episode: %d pokes, %+v", pokes, got)
	}
	for i := range maxWithheld + 10 {
		w.RecordWithheld(mac, netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), t0.Add(time.Hour+time.Duration(i+1)*time.Millisecond))
	}
	got = w.Snapshot(t0.Add(time.Hour + time.Second))
	if len(got) != maxWithheld || slices.ContainsFunc(got, func(p gateway.WithheldBoot) bool { return p.Remote == a || p.Remote == netip.MustParseAddr("10.1.0.0") }) {
		t.Fatalf("%d pairs past the bound; the least recently seen kept", len(got))
	}
}
