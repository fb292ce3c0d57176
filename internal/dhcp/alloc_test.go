package dhcp

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// oracleOffer is the allocator's offer rule written as a plain scan of the whole range (what
// offer did before its fresh mark): the reservation, the MAC's own lease, the first free address
// never leased, else the first free one. It reads a's state and changes nothing.
func oracleOffer(a *allocator, p *Pool, mac string, now time.Time) (netip.Addr, bool) {
	if ip, ok := a.reserved[mac]; ok {
		if !p.Subnet.Contains(ip) {
			return netip.Addr{}, false
		}
		return ip, true
	}
	if l, ok := a.leases[mac]; ok && p.inRange(l.IP) && a.free(l.IP, mac, now) {
		return l.IP, true
	}
	var reclaim netip.Addr
	for ip := p.Start; p.inRange(ip); ip = ip.Next() {
		if !a.free(ip, mac, now) {
			continue
		}
		if _, used := a.byIP[ip]; !used {
			return ip, true
		}
		if !reclaim.IsValid() {
			reclaim = ip
		}
	}
	return reclaim, reclaim.IsValid()
}

// TestOfferMatchesFullScan drives the allocator with random DISCOVERs, REQUESTs, RELEASEs,
// DECLINEs and clock jumps (past offer holds, leases and declines) and checks every offer
// against oracleOffer, and the fresh mark's invariant after every step.
func TestOfferMatchesFullScan(t *testing.T) {
	ctx := context.Background()
	pool := Pool{Subnet: netip.MustParsePrefix("10.1.0.0/24"), Start: netip.MustParseAddr("10.1.0.10"),
		End: netip.MustParseAddr("10.1.0.21"), LeaseTime: 20 * time.Minute}
	macs := make([]net.HardwareAddr, 20)
	for i := range macs {
		macs[i] = net.HardwareAddr{2, 0, 0, 0, 0, byte(i)}
	}
	res := []Reservation{{MAC: macs[0], IP: netip.MustParseAddr("10.1.0.12")}, {MAC: macs[1], IP: netip.MustParseAddr("10.1.0.30")}}
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			now := t0
			a, err := newAllocator(ctx, []Pool{pool}, res, &memLeases{}, nil, netip.Addr{}, now)
			if err != nil {
				t.Fatal(err)
			}
			p := &a.pools[0]
			for step := range 400 {
				mac := macs[rng.IntN(len(macs))].String()
				switch op := rng.IntN(10); {
				case op < 4:
					a.mu.Lock()
					want, wantOK := oracleOffer(a, p, mac, now)
					a.mu.Unlock()
					got, _, ok := a.offer(p, mac, now)
					if got != want || ok != wantOK {
						t.Fatalf("step %d: offer to %s = %s %v, full scan says %s %v", step, mac, got, ok, want, wantOK)
					}
				case op < 6:
					ip := netip.AddrFrom4([4]byte{10, 1, 0, byte(8 + rng.IntN(16))})
					if _, err := a.request(ctx, p, mac, ip, now); err != nil {
						t.Fatal(err)
					}
				case op < 7:
					a.mu.Lock()
					l, has := a.leases[mac]
					a.mu.Unlock()
					if has {
						if _, err := a.request(ctx, p, mac, l.IP, now); err != nil {
							t.Fatal(err)
						}
					}
				case op < 8:
					a.mu.Lock()
					l := a.leases[mac]
					a.mu.Unlock()
					if err := a.release(ctx, mac, l.IP); err != nil {
						t.Fatal(err)
					}
				case op < 9:
					a.mu.Lock()
					l := a.leases[mac]
					a.mu.Unlock()
					if err := a.decline(ctx, mac, l.IP, now); err != nil {
						t.Fatal(err)
					}
				default:
					now = now.Add(time.Duration(rng.IntN(15)) * time.Minute)
				}
				a.mu.Lock()
				if mark, ok := a.fresh[p]; ok {
					for ip := p.Start; ip.Less(mark) && p.inRange(ip); ip = ip.Next() {
						_, used := a.byIP[ip]
						_, reserved := a.owner[ip]
						_, excluded := a.excluded[ip]
						_, declined := a.declined[ip]
						if !used && !reserved && !excluded && !declined {
							t.Fatalf("step %d: fresh mark %s is past %s, neither leased, reserved, excluded nor declined", step, mark, ip)
						}
					}
				}
				a.mu.Unlock()
			}
		})
	}
}

// gatedLeases blocks every save until the test lets it go, counting saves and what they held.
type gatedLeases struct {
	memLeases
	started chan struct{}
	gate    chan struct{}
	mu      sync.Mutex
	sizes   []int
	fails   int // fail this many saves first
}

func (g *gatedLeases) SaveLeases(ctx context.Context, l []Lease) error {
	g.started <- struct{}{}
	<-g.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sizes = append(g.sizes, len(l))
	if g.fails > 0 {
		g.fails--
		return errors.New("disk full")
	}
	return g.memLeases.SaveLeases(ctx, l)
}

// TestSyncGroupsSaves: acknowledgements that arrive while a save runs are covered by one next
// save, and a failed save is not taken for a successful one.
func TestSyncGroupsSaves(t *testing.T) {
	ctx := context.Background()
	store := &gatedLeases{started: make(chan struct{}, 64), gate: make(chan struct{}, 64), fails: 1}
	a, err := newAllocator(ctx, pools(), nil, store, nil, netip.Addr{}, t0)
	if err != nil {
		t.Fatal(err)
	}
	p := &a.pools[1] // 10.9.1.10-20
	mac := func(i int) string { return net.HardwareAddr{2, 0, 0, 0, 1, byte(i)}.String() }
	req := func(i int) error {
		ip := netip.AddrFrom4([4]byte{10, 9, 1, byte(10 + i)})
		ok, err := a.request(ctx, p, mac(i), ip, t0)
		if err == nil && !ok {
			err = fmt.Errorf("request %d refused", i)
		}
		return err
	}
	// The first save fails: its REQUEST gets the error.
	first := make(chan error, 1)
	go func() { first <- req(0) }()
	<-store.started
	// Five more arrive while it runs, and wait.
	errs := make(chan error, 5)
	for i := 1; i <= 5; i++ {
		go func() { errs <- req(i) }()
	}
	waitFor(t, func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.gen == 6 })
	store.gate <- struct{}{}
	if err := <-first; err == nil {
		t.Fatal("a failed save acknowledged")
	}
	// One save covers all five (and the first lease, still bound).
	<-store.started
	store.gate <- struct{}{}
	for range 5 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if len(store.started) != 0 {
		t.Fatalf("%d more saves started", len(store.started))
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.sizes) != 2 || store.sizes[1] != 6 || len(store.leases) != 6 {
		t.Fatalf("saves of %v leases, store holds %d; want a failed one, then one of all 6", store.sizes, len(store.leases))
	}
}

// waitFor polls cond until it holds, for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}
