package dhcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
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

// SaveLeases writes a temporary file beside the lease file, syncs it and renames it over.
func (f *FileLeaseStore) SaveLeases(ctx context.Context, leases []Lease) error {
	b, err := json.MarshalIndent(leaseFile{Version: 1, Leases: leases}, "", " ")
	if err != nil {
		return fmt.Errorf("saving leases: %w", err)
	}
	dir := filepath.Dir(f.path)
	tmp, err := os.CreateTemp(dir, filepath.Base(f.path)+".tmp*")
	if err != nil {
		return fmt.Errorf("saving leases: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return fmt.Errorf("saving leases: writing: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("saving leases: syncing: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("saving leases: closing: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		return fmt.Errorf("saving leases: renaming: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
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
}

func newAllocator(ctx context.Context, pools []Pool, res []Reservation, store LeaseStore, now time.Time) (*allocator, error) {
	a := &allocator{
		pools:    pools,
		reserved: map[string]netip.Addr{},
		owner:    map[netip.Addr]string{},
		leases:   map[string]Lease{},
		byIP:     map[netip.Addr]string{},
		declined: map[netip.Addr]time.Time{},
		store:    store,
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
	for _, l := range loaded {
		if !l.Expires.After(now) || a.poolFor(l.IP) == nil {
			continue // expired, or the pool it came from is gone
		}
		if o, ok := a.owner[l.IP]; ok && o != l.MAC {
			continue // now reserved for someone else
		}
		if _, taken := a.byIP[l.IP]; taken {
			continue
		}
		a.leases[l.MAC] = l
		a.byIP[l.IP] = l.MAC
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
		delete(a.byIP, old.IP)
	}
	if m, ok := a.byIP[ip]; ok && m != mac {
		delete(a.leases, m)
	}
	a.leases[mac] = Lease{MAC: mac, IP: ip, Expires: until}
	a.byIP[ip] = mac
}

// offer picks an address for mac in pool p: its reservation, its current lease, or the first
// free address of the range (never used before preferred over reclaimed ones).
func (a *allocator) offer(p *Pool, mac string, now time.Time) (netip.Addr, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ip, ok := a.reserved[mac]; ok {
		if !p.Subnet.Contains(ip) {
			return netip.Addr{}, false
		}
		a.hold(mac, ip, now)
		return ip, true
	}
	if l, ok := a.leases[mac]; ok && p.inRange(l.IP) && a.free(l.IP, mac, now) {
		a.hold(mac, l.IP, now)
		return l.IP, true
	}
	var reclaim netip.Addr
	for ip := p.Start; ip.IsValid() && p.inRange(ip); ip = ip.Next() {
		if !a.free(ip, mac, now) {
			continue
		}
		if _, used := a.byIP[ip]; !used {
			a.hold(mac, ip, now)
			return ip, true
		}
		if !reclaim.IsValid() {
			reclaim = ip
		}
	}
	if reclaim.IsValid() {
		a.hold(mac, reclaim, now)
		return reclaim, true
	}
	return netip.Addr{}, false
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
	a.mu.Lock()
	defer a.mu.Unlock()
	if !p.Subnet.Contains(ip) {
		return false, nil
	}
	if r, ok := a.reserved[mac]; ok {
		if r != ip {
			return false, nil
		}
	} else if !p.inRange(ip) {
		return false, nil
	}
	if !a.free(ip, mac, now) {
		return false, nil
	}
	lt := p.LeaseTime
	if lt == 0 {
		lt = time.Hour
	}
	a.bind(mac, ip, now.Add(lt))
	return true, a.persist(ctx)
}

func (a *allocator) release(ctx context.Context, mac string, ip netip.Addr) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.leases[mac]; ok && l.IP == ip {
		delete(a.leases, mac)
		delete(a.byIP, ip)
		return a.persist(ctx)
	}
	return nil
}

func (a *allocator) decline(ctx context.Context, mac string, ip netip.Addr, now time.Time) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l, ok := a.leases[mac]; ok && l.IP == ip {
		delete(a.leases, mac)
		delete(a.byIP, ip)
		a.declined[ip] = now.Add(10 * time.Minute)
		return a.persist(ctx)
	}
	return nil
}

// persist saves every lease that runs longer than an offer hold (acknowledged ones).
func (a *allocator) persist(ctx context.Context) error {
	out := make([]Lease, 0, len(a.leases))
	for _, l := range a.leases {
		out = append(out, l)
	}
	slices.SortFunc(out, func(x, y Lease) int { return x.IP.Compare(y.IP) })
	return a.store.SaveLeases(ctx, out)
}

// snapshot returns the current leases (tests, status).
func (a *allocator) snapshot() []Lease {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Lease, 0, len(a.leases))
	for _, l := range a.leases {
		out = append(out, l)
	}
	slices.SortFunc(out, func(x, y Lease) int { return x.IP.Compare(y.IP) })
	return out
}
