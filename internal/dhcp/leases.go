package dhcp

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"bcd/internal/durable"
)

// Lease binds an address to a client MAC until Expires.
type Lease struct {
	MAC     string     `json:"mac"` // net.HardwareAddr.String()
	IP      netip.Addr `json:"ip"`
	Expires time.Time  `json:"expires"`
}

// LeaseStore persists the full-mode leases across restarts.
type LeaseStore interface {
	LoadLeases(ctx context.Context) ([]Lease, error)
	SaveLeases(ctx context.Context, leases []Lease) error
}

// FileLeaseStore keeps leases in one JSON file, replaced atomically on every save.
type FileLeaseStore struct {
	path string
}

// NewFileLeaseStore stores leases at path (its directory must exist).
func NewFileLeaseStore(path string) *FileLeaseStore { return &FileLeaseStore{path: path} }

type leaseFile struct {
	Version int     `json:"version"`
	Leases  []Lease `json:"leases"`
}

// LoadLeases reads the file; a missing file is an empty lease set.
func (f *FileLeaseStore) LoadLeases(ctx context.Context) ([]Lease, error) {
	b, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("loading leases: %w", err)
	}
	var lf leaseFile
	if err := json.Unmarshal(b, &lf); err != nil {
		return nil, fmt.Errorf("loading leases from %s: %w", f.path, err)
	}
	if lf.Version != 1 {
		return nil, fmt.Errorf("loading leases from %s: unknown version %d", f.path, lf.Version)
	}
	return lf.Leases, nil
}

// SaveLeases replaces the lease file atomically and durably.
func (f *FileLeaseStore) SaveLeases(ctx context.Context, leases []Lease) error {
	b, err := json.Marshal(leaseFile{Version: 1, Leases: leases}) // compact: it is rewritten on every save
	if err != nil {
		return fmt.Errorf("saving leases: %w", err)
	}
	if err := durable.WriteFile(f.path, b, 0o600); err != nil {
		return fmt.Errorf("saving leases: %w", err)
	}
	return nil
}

// Pool is one subnet that full mode hands out addresses in.
type Pool struct {
	Subnet    netip.Prefix // e.g. 10.0.0.0/24; selects the pool by giaddr (relayed) or ServerIP (direct)
	Start     netip.Addr   // first address handed out
	End       netip.Addr   // last address handed out
	Routers   []netip.Addr
	DNS       []netip.Addr
	Domain    string
	LeaseTime time.Duration // 0: 1 h
}

func (p Pool) validate() error {
	if !p.Subnet.IsValid() || !p.Subnet.Addr().Is4() {
		return fmt.Errorf("pool subnet %s: must be an IPv4 prefix", p.Subnet)
	}
	if !p.Subnet.Contains(p.Start) || !p.Subnet.Contains(p.End) || p.End.Less(p.Start) {
		return fmt.Errorf("pool %s: range %s-%s must lie inside the subnet, start before end", p.Subnet, p.Start, p.End)
	}
	for _, r := range p.Routers {
		if !r.Is4() {
			return fmt.Errorf("pool %s: router %s is not IPv4", p.Subnet, r)
		}
	}
	for _, r := range p.DNS {
		if !r.Is4() {
			return fmt.Errorf("pool %s: DNS server %s is not IPv4", p.Subnet, r)
		}
	}
	if len(p.Domain) > 253 {
		return fmt.Errorf("pool %s: domain too long", p.Subnet)
	}
	return nil
}

func (p Pool) inRange(a netip.Addr) bool {
	return !a.Less(p.Start) && !p.End.Less(a)
}

// Reservation pins an address to a MAC.
type Reservation struct {
	MAC net.HardwareAddr
	IP  netip.Addr
}

// offerHold is how long an offered address stays set aside for the client it was offered to.
const offerHold = time.Minute

// allocator hands out addresses from pools; it persists acknowledged leases through the store.
type allocator struct {
	mu       sync.Mutex
	pools    []Pool
	reserved map[string]netip.Addr // mac → ip
	owner    map[netip.Addr]string // reserved ip → mac
	// excluded: addresses of a pool's subnet no client may have (see exclusions), whatever
	// its range says.
	excluded map[netip.Addr]string // ip → what it is
	leases   map[string]Lease      // mac → lease (acknowledged or offered)
	byIP     map[netip.Addr]string // ip → mac
	// declined: addresses held back until a time (declined by a client, or answering a probe);
	// an entry goes once its time has passed (expireDeclines), at the latest at declinedNext.
	declined     map[netip.Addr]time.Time
	declinedNext time.Time
	store        LeaseStore
	// fresh[p] is where offer looks for a never-used address of pool p: every address of its
	// range below it is leased (byIP), reserved, excluded or declined. Lowered whenever an
	// address leaves byIP or declined, so the search is amortised O(1) instead of a scan of the
	// whole range per DISCOVER.
	fresh map[*Pool]netip.Addr
	// reclaim[p] is where offer looks for an expired lease to reclaim in pool p, once no address
	// of it is fresh: see reclaimMark. Dropped whenever an address of p may be free earlier.
	reclaim map[*Pool]reclaimMark
	// examined counts the addresses offer looked at past a client's own (its cost, for tests).
	examined uint64
	// gen counts lease changes that must reach the store (under mu). Saves are group commits:
	// saveMu admits one SaveLeases at a time, of a snapshot at generation saved; a change whose
	// generation is covered by a finished save returns at once (see sync).
	gen    uint64
	saveMu sync.Mutex
	saved  uint64 // under saveMu
}

// reclaimMark: no address of the range below from is free before until (zero: ever, by time
// alone), so the search for a lease to reclaim starts at from until then. A pool exhausted
// by a flood of DISCOVERs costs O(1) a DISCOVER instead of a scan of its whole range.
type reclaimMark struct {
	from  netip.Addr
	until time.Time
}

// exclusions are the addresses of the pools' subnets that no client may be given, even when a
// range covers them (an easy mistake: the range of "the whole /24"): the server's own address,
// the pools' routers and DNS servers, and each subnet's network and broadcast addresses.
func exclusions(pools []Pool, server netip.Addr) map[netip.Addr]string {
	ex := map[netip.Addr]string{}
	for _, p := range pools {
		if p.Subnet.Bits() <= 30 {
			network := p.Subnet.Masked().Addr()
			ex[network] = "the network address of " + p.Subnet.String()
			b := network.As4()
			binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])|(1<<(32-p.Subnet.Bits())-1))
			ex[netip.AddrFrom4(b)] = "the broadcast address of " + p.Subnet.String()
		}
		for _, r := range p.Routers {
			ex[r] = "a router"
		}
		for _, d := range p.DNS {
			ex[d] = "a DNS server"
		}
	}
	if server.IsValid() {
		ex[server] = "the server's own address"
	}
	return ex
}

// newAllocator loads the leases of store and merges known (leases granted by another agent of
// the site) into them. server is the DHCP server's own address (never handed out).
func newAllocator(ctx context.Context, pools []Pool, res []Reservation, store LeaseStore, known []Lease, server netip.Addr, now time.Time) (*allocator, error) {
	a := &allocator{
		pools:    pools,
		reserved: map[string]netip.Addr{},
		owner:    map[netip.Addr]string{},
		excluded: exclusions(pools, server),
		leases:   map[string]Lease{},
		byIP:     map[netip.Addr]string{},
		declined: map[netip.Addr]time.Time{},
		store:    store,
		fresh:    map[*Pool]netip.Addr{},
		reclaim:  map[*Pool]reclaimMark{},
	}
	for _, r := range res {
		if len(r.MAC) != 6 || !r.IP.Is4() {
			return nil, fmt.Errorf("reservation %s → %s: needs a 6-byte MAC and an IPv4 address", r.MAC, r.IP)
		}
		if a.poolFor(r.IP) == nil {
			return nil, fmt.Errorf("reservation %s → %s: address in no pool subnet", r.MAC, r.IP)
		}
		if what, ok := a.excluded[r.IP]; ok {
			return nil, fmt.Errorf("reservation %s → %s: the address is %s", r.MAC, r.IP, what)
		}
		if _, dup := a.owner[r.IP]; dup {
			return nil, fmt.Errorf("reservation %s: address %s reserved twice", r.MAC, r.IP)
		}
		a.reserved[r.MAC.String()] = r.IP
		a.owner[r.IP] = r.MAC.String()
	}
	loaded, err := store.LoadLeases(ctx)
	if err != nil {
		return nil, err
	}
	// Ours first, then those known from elsewhere (another agent of the site); where a MAC or an
	// address has two leases, the one that runs longer wins.
	type candidate struct {
		Lease
		known bool
	}
	all := make([]candidate, 0, len(loaded)+len(known))
	for _, l := range loaded {
		all = append(all, candidate{Lease: l})
	}
	for _, l := range known {
		all = append(all, candidate{Lease: l, known: true})
	}
	slices.SortStableFunc(all, func(x, y candidate) int { return y.Expires.Compare(x.Expires) })
	merged := false
	for _, c := range all {
		l := c.Lease
		if !l.Expires.After(now) || a.poolFor(l.IP) == nil {
			continue // expired, or the pool it came from is gone
		}
		if o, ok := a.owner[l.IP]; ok && o != l.MAC {
			continue // now reserved for someone else
		}
		if _, ok := a.excluded[l.IP]; ok {
			continue // no client's to have
		}
		if _, taken := a.byIP[l.IP]; taken {
			continue
		}
		if _, has := a.leases[l.MAC]; has {
			continue
		}
		a.leases[l.MAC] = l
		a.byIP[l.IP] = l.MAC
		merged = merged || c.known
	}
	if merged {
		a.gen++
		if err := a.sync(ctx); err != nil {
			return nil, fmt.Errorf("keeping the leases known from the site: %w", err)
		}
	}
	return a, nil
}

// poolFor returns the pool whose subnet holds addr.
func (a *allocator) poolFor(addr netip.Addr) *Pool {
	for i := range a.pools {
		if a.pools[i].Subnet.Contains(addr) {
			return &a.pools[i]
		}
	}
	return nil
}

// free reports whether ip can go to mac now.
func (a *allocator) free(ip netip.Addr, mac string, now time.Time) bool {
	if o, ok := a.owner[ip]; ok && o != mac {
		return false
	}
	if _, ok := a.excluded[ip]; ok {
		return false
	}
	if until, ok := a.declined[ip]; ok && now.Before(until) {
		return false
	}
	if m, ok := a.byIP[ip]; ok && m != mac && a.leases[m].Expires.After(now) {
		return false
	}
	return true
}

func (a *allocator) bind(mac string, ip netip.Addr, until time.Time) {
	if old, ok := a.leases[mac]; ok && old.IP != ip {
		a.unuse(old.IP)
	} else if ok && until.Before(old.Expires) {
		a.freer(ip) // shortened: free earlier than a reclaim mark may say
	}
	if m, ok := a.byIP[ip]; ok && m != mac {
		delete(a.leases, m)
	}
	a.leases[mac] = Lease{MAC: mac, IP: ip, Expires: until}
	a.byIP[ip] = mac
}

// offer picks an address for mac in pool p: its reservation, its current lease, or the first
// free address of the range (never used before preferred over reclaimed ones). fresh says the
// address is new to mac (neither its reservation nor its lease).
func (a *allocator) offer(p *Pool, mac string, now time.Time) (ip netip.Addr, fresh, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ip, ok := a.reserved[mac]; ok {
		if !p.Subnet.Contains(ip) {
			return netip.Addr{}, false, false
		}
		a.hold(mac, ip, now)
		return ip, false, true
	}
	if l, ok := a.leases[mac]; ok && p.inRange(l.IP) && a.free(l.IP, mac, now) {
		a.hold(mac, l.IP, now)
		return l.IP, false, true
	}
	a.expireDeclines(now)
	// Never used before: from the pool's fresh mark on. The mark moves past addresses that are
	// leased, reserved for another MAC, excluded or declined (expireDeclines lowers it again).
	mark := a.fresh[p]
	if !mark.IsValid() || mark.Less(p.Start) {
		mark = p.Start
	}
	advancing := true
	for ip := mark; ip.IsValid() && p.inRange(ip); ip = ip.Next() {
		a.examined++
		_, used := a.byIP[ip]
		_, reserved := a.owner[ip] // another MAC's: ours took the reservation path above
		_, excluded := a.excluded[ip]
		_, declined := a.declined[ip]
		if used || reserved || excluded || declined {
			if advancing {
				mark = ip.Next()
			}
			continue
		}
		if !a.free(ip, mac, now) {
			advancing = false
			continue
		}
		if advancing {
			mark = ip
		}
		a.fresh[p] = mark
		a.hold(mac, ip, now)
		return ip, true, true
	}
	a.fresh[p] = mark
	// Reclaimed: nothing unused is free, so the first free address is an expired lease. What
	// does not depend on mac: its reservation and its own lease were tried above.
	start, until := p.Start, time.Time{}
	if r, ok := a.reclaim[p]; ok && (r.until.IsZero() || now.Before(r.until)) {
		start, until = r.from, r.until
	}
	ip = start
	for ; ip.IsValid() && p.inRange(ip); ip = ip.Next() {
		a.examined++
		if a.free(ip, mac, now) {
			a.reclaim[p] = reclaimMark{from: ip, until: until}
			a.hold(mac, ip, now)
			return ip, true, true
		}
		if t, ok := a.freeAt(ip); ok && (until.IsZero() || t.Before(until)) {
			until = t
		}
	}
	a.reclaim[p] = reclaimMark{from: ip, until: until}
	return netip.Addr{}, false, false
}

// freeAt is when ip, not free now, may become free by time alone: when its lease ends and
// it is declined no more. false: never (reserved for another MAC, or excluded).
func (a *allocator) freeAt(ip netip.Addr) (time.Time, bool) {
	if _, ok := a.owner[ip]; ok {
		return time.Time{}, false
	}
	if _, ok := a.excluded[ip]; ok {
		return time.Time{}, false
	}
	var t time.Time
	if m, ok := a.byIP[ip]; ok {
		t = a.leases[m].Expires
	}
	if d, ok := a.declined[ip]; ok && d.After(t) {
		t = d
	}
	return t, true
}

// expireDeclines forgets the declines that ended by now, lowering the fresh marks to them.
func (a *allocator) expireDeclines(now time.Time) {
	if len(a.declined) == 0 || now.Before(a.declinedNext) {
		return
	}
	a.declinedNext = time.Time{}
	for ip, until := range a.declined {
		if !now.Before(until) {
			delete(a.declined, ip)
			a.freer(ip)
			continue
		}
		if a.declinedNext.IsZero() || until.Before(a.declinedNext) {
			a.declinedNext = until
		}
	}
}

// freer notes that ip may be free earlier than the marks of its pool say: the fresh mark is
// lowered to it and the reclaim mark dropped.
func (a *allocator) freer(ip netip.Addr) {
	p := a.poolFor(ip)
	if p == nil {
		return
	}
	if f, ok := a.fresh[p]; ok && ip.Less(f) {
		a.fresh[p] = ip
	}
	delete(a.reclaim, p)
}

// unuse forgets who had ip and lowers its pool's marks to it (freer).
func (a *allocator) unuse(ip netip.Addr) {
	delete(a.byIP, ip)
	a.freer(ip)
}

// hold sets an offered address aside without persisting it; an acknowledged lease that still
// runs longer keeps its expiry.
func (a *allocator) hold(mac string, ip netip.Addr, now time.Time) {
	until := now.Add(offerHold)
	if l, ok := a.leases[mac]; ok && l.IP == ip && l.Expires.After(until) {
		until = l.Expires
	}
	a.bind(mac, ip, until)
}

// request decides a DHCPREQUEST for ip in pool p: ok → the lease is bound and persisted.
func (a *allocator) request(ctx context.Context, p *Pool, mac string, ip netip.Addr, now time.Time) (bool, error) {
	if !a.grant(p, mac, ip, now) {
		return false, nil
	}
	return true, a.sync(ctx)
}

// grant binds ip to mac when the request may have it.
func (a *allocator) grant(p *Pool, mac string, ip netip.Addr, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !p.Subnet.Contains(ip) {
		return false
	}
	if r, ok := a.reserved[mac]; ok {
		if r != ip {
			return false
		}
	} else if !p.inRange(ip) {
		return false
	}
	if !a.free(ip, mac, now) {
		return false
	}
	a.bind(mac, ip, now.Add(leaseTime(p)))
	a.gen++
	return true
}

func (a *allocator) release(ctx context.Context, mac string, ip netip.Addr) error {
	if !a.drop(mac, ip, time.Time{}) {
		return nil
	}
	return a.sync(ctx)
}

func (a *allocator) decline(ctx context.Context, mac string, ip netip.Addr, now time.Time) error {
	if !a.drop(mac, ip, now.Add(10*time.Minute)) {
		return nil
	}
	return a.sync(ctx)
}

// drop ends mac's lease of ip, if it has it; a non-zero declinedUntil keeps ip out of offers
// until then.
func (a *allocator) drop(mac string, ip netip.Addr, declinedUntil time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.leases[mac]
	if !ok || l.IP != ip {
		return false
	}
	delete(a.leases, mac)
	a.unuse(ip)
	if !declinedUntil.IsZero() {
		a.declined[ip] = declinedUntil
		if a.declinedNext.IsZero() || declinedUntil.Before(a.declinedNext) {
			a.declinedNext = declinedUntil
		}
	}
	a.gen++
	return true
}

// sync returns once the store holds every change made before it was called. Callers that
// arrive while a save runs wait for it and then find their change saved by the next one, which
// the first of them makes: one SaveLeases covers a whole burst of acknowledgements.
func (a *allocator) sync(ctx context.Context) error {
	a.mu.Lock()
	want := a.gen
	a.mu.Unlock()
	a.saveMu.Lock()
	defer a.saveMu.Unlock()
	if a.saved >= want {
		return nil
	}
	a.mu.Lock()
	out, gen := a.list(), a.gen
	a.mu.Unlock()
	if err := a.store.SaveLeases(ctx, out); err != nil {
		return err
	}
	a.saved = gen
	return nil
}

// list returns every lease, ordered by address; a.mu must be held.
func (a *allocator) list() []Lease {
	out := make([]Lease, 0, len(a.leases))
	for _, l := range a.leases {
		out = append(out, l)
	}
	slices.SortFunc(out, func(x, y Lease) int { return x.IP.Compare(y.IP) })
	return out
}

// snapshot returns the current leases (tests, status).
func (a *allocator) snapshot() []Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.list()
}
