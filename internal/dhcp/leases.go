package dhcp

import (
	"context"
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
	leases   map[string]Lease      // mac → lease (acknowledged or offered)
	byIP     map[netip.Addr]string // ip → mac
	declined map[netip.Addr]time.Time
	store    LeaseStore
	// fresh[p] is where offer looks for a never-used address of pool p: every address of its
	// range below it is leased (byIP) or reserved. Lowered whenever an address leaves byIP, so
	// the search is amortised O(1) instead of a scan of the whole range per DISCOVER.
	fresh map[*Pool]netip.Addr
	// gen counts lease changes that must reach the store (under mu). Saves are group commits:
	// saveMu admits one SaveLeases at a time, of a snapshot at generation saved; a change whose
	// generation is covered by a finished save returns at once (see sync).
	gen    uint64
	saveMu sync.Mutex
	saved  uint64 // under saveMu
}

// newAllocator loads the leases of store and merges known (leases granted by another agent of
// the site) into them.
func newAllocator(ctx context.Context, pools []Pool, res []Reservation, store LeaseStore, known []Lease, now time.Time) (*allocator, error) {
	a := &allocator{
		pools:    pools,
		reserved: map[string]netip.Addr{},
		owner:    map[netip.Addr]string{},
		leases:   map[string]Lease{},
		byIP:     map[netip.Addr]string{},
		declined: map[netip.Addr]time.Time{},
		store:    store,
		fresh:    map[*Pool]netip.Addr{},
	}
	for _, r := range res {
		if len(r.MAC) != 6 || !r.IP.Is4() {
			return nil, fmt.Errorf("reservation %s → %s: needs a 6-byte MAC and an IPv4 address", r.MAC, r.IP)
		}
		if a.poolFor(r.IP) == nil {
			return nil, fmt.Errorf("reservation %s → %s: address in no pool subnet", r.MAC, r.IP)
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
	// Never used before: from the pool's fresh mark on. The mark moves past addresses that are
	// leased or reserved for another MAC, not past a declined one (free again one day).
	mark := a.fresh[p]
	if !mark.IsValid() || mark.Less(p.Start) {
		mark = p.Start
	}
	advancing := true
	for ip := mark; ip.IsValid() && p.inRange(ip); ip = ip.Next() {
		_, used := a.byIP[ip]
		_, reserved := a.owner[ip] // another MAC's: ours took the reservation path above
		if used || reserved {
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
	// Reclaimed: nothing unused is free, so the first free address is an expired lease.
	for ip := p.Start; ip.IsValid() && p.inRange(ip); ip = ip.Next() {
		if a.free(ip, mac, now) {
			a.hold(mac, ip, now)
			return ip, true, true
		}
	}
	return netip.Addr{}, false, false
}

// unuse forgets who had ip and lowers its pool's fresh mark to it.
func (a *allocator) unuse(ip netip.Addr) {
	delete(a.byIP, ip)
	if p := a.poolFor(ip); p != nil {
		if f, ok := a.fresh[p]; ok && ip.Less(f) {
			a.fresh[p] = ip
		}
	}
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
