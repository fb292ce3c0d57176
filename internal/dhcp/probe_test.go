package dhcp

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// fakeProber answers from a set of addresses in use and counts what it was asked.
type fakeProber struct {
	mu    sync.Mutex
	used  map[netip.Addr]bool
	asked []netip.Addr
	err   error
}

func (f *fakeProber) InUse(_ context.Context, ip netip.Addr) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, ip)
	return f.used[ip], f.err
}

func (f *fakeProber) take() []netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.asked
	f.asked = nil
	return out
}

// While probing lasts (after a start, e.g. as the site's new boot-lease holder), an address new
// to the client is probed before it is offered: one that answers (leased by a server that
// never told this one) is skipped and held back for a lease time, also from later clients; a
// client's own lease and reservation are not probed. Once probing ends nothing is probed; a
// probe that fails offers anyway.
func TestOfferProbesNewAddresses(t *testing.T) {
	ctx := context.Background()
	a100, a101, a102 := netip.MustParseAddr("10.0.0.100"), netip.MustParseAddr("10.0.0.101"), netip.MustParseAddr("10.0.0.102")
	for _, tc := range []struct {
		name      string
		probeFor  time.Duration
		err       error
		wantOffer netip.Addr
		wantAsked []netip.Addr
	}{
		{"in use skipped", 0, nil, a101, []netip.Addr{a100, a101}},
		{"probing over", time.Minute, nil, a100, nil},
		{"probe fails", 0, errors.New("no raw socket"), a100, []netip.Addr{a100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{t0}
			probe := &fakeProber{used: map[netip.Addr]bool{a100: true}, err: tc.err}
			reserved := Reservation{MAC: macB, IP: netip.MustParseAddr("10.0.0.50")}
			s, err := New(ctx, Config{
				Mode: ModeFull, Interface: "prov0", ServerIP: serverIP, HTTPBaseURL: base, Boot: Policy{EFIBinary: BinaryEFI},
				Pools: pools(), Reservations: []Reservation{reserved}, Leases: NewFileLeaseStore(filepath.Join(t.TempDir(), "leases.json")),
				Now: clk.now, Probe: probe, ProbeFor: tc.probeFor,
			})
			if err != nil {
				t.Fatal(err)
			}
			if tc.probeFor > 0 {
				clk.t = clk.t.Add(tc.probeFor) // probing has ended
			}
			offer := s.Handle(ctx, ListenerDHCP, discover(t, macA))
			if offer == nil || offer.YourIPAddr.String() != tc.wantOffer.String() {
				t.Fatalf("offer %v, want %s", offer, tc.wantOffer)
			}
			if got := probe.take(); !equalAddrs(got, tc.wantAsked) {
				t.Fatalf("probed %v, want %v", got, tc.wantAsked)
			}
			ack := s.Handle(ctx, ListenerDHCP, request(t, macA, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(offer.YourIPAddr)),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(serverIP.AsSlice()))))
			if ack == nil || ack.MessageType() != dhcpv4.MessageTypeAck {
				t.Fatalf("request: %v", ack)
			}
			// The client's own lease, and a reserved client's address, are not probed.
			if again := s.Handle(ctx, ListenerDHCP, discover(t, macA)); again == nil || again.YourIPAddr.String() != tc.wantOffer.String() {
				t.Fatalf("A again: %v", again)
			}
			if res := s.Handle(ctx, ListenerDHCP, discover(t, macB)); res == nil || res.YourIPAddr.String() != "10.0.0.50" {
				t.Fatalf("reserved client: %v", res)
			}
			if got := probe.take(); len(got) != 0 {
				t.Fatalf("probed %v for a client's own lease or reservation", got)
			}
			if tc.name != "in use skipped" {
				return
			}
			// The address that answered stays held back from the next client too.
			macC := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0c}
			c := s.Handle(ctx, ListenerDHCP, discover(t, macC))
			if c == nil || c.YourIPAddr.String() != a102.String() {
				t.Fatalf("C offered %v, want %s (10.0.0.100 answered, 10.0.0.101 is A's)", c, a102)
			}
		})
	}
}

func equalAddrs(a, b []netip.Addr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
