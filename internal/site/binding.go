package site

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"bcd/internal/dhcp"
	"bcd/internal/gateway"
)

// BootBinding says to which address the site agent serves a MAC's boot script (it carries the
// node's one-time token) and a node's metadata (its instance token).
type BootBinding string

const (
	// BindLease: only to the address the agent's DHCP (proxy, full or observe) saw that MAC
	// take.
	BindLease BootBinding = "lease"
	// BindNone: to whoever asks by MAC; /metadata answers the address a MAC's script was last
	// fetched from. For a site whose DHCP the agent does not see (DHCP off).
	BindNone BootBinding = "none"
)

// checkBootBinding validates b against the DHCP mode; "" takes lease when the agent runs DHCP
// and none otherwise.
func checkBootBinding(b BootBinding, dhcpOn bool) (BootBinding, error) {
	switch {
	case b == "" && dhcpOn:
		return BindLease, nil
	case b == "":
		return BindNone, nil
	case b == BindLease && !dhcpOn:
		return "", fmt.Errorf("boot binding %q needs the agent's DHCP (proxy, full, or observe beside the site's DHCP server): with DHCP off it never sees which address a machine takes; use %q", b, BindNone)
	case b == BindLease, b == BindNone:
		return b, nil
	}
	return "", fmt.Errorf("boot binding %q: accepted are %s and %s", b, BindLease, BindNone)
}

// addrBook keeps which address each MAC holds, both ways: one address per MAC and one MAC per
// address (a newer binding replaces both sides of an older one). Not safe for concurrent use:
// Entries guards it.
type addrBook struct {
	byAddr map[netip.Addr]bookEntry
	byMAC  map[string]netip.Addr
	max    int
}

type bookEntry struct {
	mac     string
	expires time.Time // zero: until replaced
}

func newAddrBook(max int) *addrBook {
	return &addrBook{byAddr: map[netip.Addr]bookEntry{}, byMAC: map[string]netip.Addr{}, max: max}
}

// bind records that mac holds addr until expires (zero: until replaced).
func (b *addrBook) bind(mac string, addr netip.Addr, expires time.Time) {
	addr = addr.Unmap()
	if old, ok := b.byMAC[mac]; ok && old != addr {
		delete(b.byAddr, old)
	}
	if prev, ok := b.byAddr[addr]; ok && prev.mac != mac {
		delete(b.byMAC, prev.mac)
	}
	if _, ok := b.byAddr[addr]; !ok && len(b.byAddr) >= b.max {
		for a, e := range b.byAddr { // drop an arbitrary one: a bound, not a cache policy
			delete(b.byAddr, a)
			delete(b.byMAC, e.mac)
			break
		}
	}
	b.byAddr[addr] = bookEntry{mac: mac, expires: expires}
	b.byMAC[mac] = addr
}

// unbind forgets that mac holds addr (given back); a different binding of either stays.
func (b *addrBook) unbind(mac string, addr netip.Addr) {
	addr = addr.Unmap()
	if e, ok := b.byAddr[addr]; ok && e.mac == mac {
		delete(b.byAddr, addr)
		delete(b.byMAC, mac)
	}
}

// macAt is the MAC holding addr at now.
func (b *addrBook) macAt(addr netip.Addr, now time.Time) (string, bool) {
	e, ok := b.byAddr[addr.Unmap()]
	if !ok || (!e.expires.IsZero() && !now.Before(e.expires)) {
		return "", false
	}
	return e.mac, true
}

// holds answers whether mac holds addr at now.
func (b *addrBook) holds(mac string, addr netip.Addr, now time.Time) bool {
	m, ok := b.macAt(addr, now)
	return ok && m == mac
}

// dhcpReports collects the leases the holder's DHCP (full mode) granted or ended until a renewal
// of the boot lease at the epoch held carries them to the control plane, which gives them to the
// site's next holder (gatewayLease). The latest change per MAC is kept. Safe for concurrent use.
type dhcpReports struct {
	mu      sync.Mutex
	pending map[string]gateway.DHCPLease
}

func newDHCPReports() *dhcpReports {
	return &dhcpReports{pending: map[string]gateway.DHCPLease{}}
}

// observe records a lease granted (Expires set) or ended (Released); proxy mode's bindings,
// which are no leases of ours, are ignored.
func (r *dhcpReports) observe(b dhcp.Binding) {
	if len(b.MAC) != 6 || !b.IP.Is4() || (b.Expires.IsZero() && !b.Released) {
		return
	}
	l := gateway.DHCPLease{MAC: b.MAC.String(), IP: b.IP, Expires: b.Expires}
	if b.Released {
		l.Expires = time.Time{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending[l.MAC] = l
}

// take returns at most max pending changes (by MAC), still pending until sent confirms them.
func (r *dhcpReports) take(max int) []gateway.DHCPLease {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]gateway.DHCPLease, 0, min(len(r.pending), max))
	for _, l := range r.pending {
		out = append(out, l)
	}
	slices.SortFunc(out, func(x, y gateway.DHCPLease) int { return strings.Compare(x.MAC, y.MAC) })
	return out[:min(len(out), max)]
}

// sent drops the changes the control plane kept, unless a newer one replaced them meanwhile.
func (r *dhcpReports) sent(ls []gateway.DHCPLease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range ls {
		if p, ok := r.pending[l.MAC]; ok && p.IP == l.IP && p.Expires.Equal(l.Expires) {
			delete(r.pending, l.MAC)
		}
	}
}

// len is the number of changes not yet reported.
func (r *dhcpReports) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending)
}

// withheldKeep is how long after its last request a withheld (MAC, address) pair stays in the
// status reports; maxWithheld bounds the pairs kept (the least recently seen goes first).
const (
	withheldKeep = 10 * time.Minute
	maxWithheld  = 256
)

// withheldBoots remembers the boot scripts withheld by the boot binding, per MAC and requesting
// address, for the status reports (the control plane records a site.boot_withheld event per
// pair and episode). Safe for concurrent use.
type withheldBoots struct {
	changed func() // a new pair: a status report is due

	mu    sync.Mutex
	pairs map[withheldKey]gateway.WithheldBoot
}

type withheldKey struct {
	mac    string
	remote netip.Addr
}

func newWithheldBoots(changed func()) *withheldBoots {
	return &withheldBoots{changed: changed, pairs: map[withheldKey]gateway.WithheldBoot{}}
}

// RecordWithheld implements netboot.WithheldRecorder.
func (w *withheldBoots) RecordWithheld(mac net.HardwareAddr, remote netip.Addr, at time.Time) {
	k := withheldKey{mac: mac.String(), remote: remote.Unmap()}
	w.mu.Lock()
	w.expireLocked(at)
	p, ok := w.pairs[k]
	if !ok {
		if len(w.pairs) >= maxWithheld {
			w.evictLocked()
		}
		p = gateway.WithheldBoot{MAC: k.mac, Remote: k.remote, First: at}
	}
	p.Count++
	p.Last = at
	w.pairs[k] = p
	w.mu.Unlock()
	if !ok {
		w.changed()
	}
}

// Snapshot is the pairs seen within withheldKeep of now, by MAC and address.
func (w *withheldBoots) Snapshot(now time.Time) []gateway.WithheldBoot {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expireLocked(now)
	out := make([]gateway.WithheldBoot, 0, len(w.pairs))
	for _, p := range w.pairs {
		out = append(out, p)
	}
	slices.SortFunc(out, func(x, y gateway.WithheldBoot) int {
		if c := strings.Compare(x.MAC, y.MAC); c != 0 {
			return c
		}
		return x.Remote.Compare(y.Remote)
	})
	return out
}

func (w *withheldBoots) expireLocked(now time.Time) {
	for k, p := range w.pairs {
		if now.Sub(p.Last) >= withheldKeep {
			delete(w.pairs, k)
		}
	}
}

func (w *withheldBoots) evictLocked() {
	var oldest withheldKey
	var at time.Time
	first := true
	for k, p := range w.pairs {
		if first || p.Last.Before(at) {
			oldest, at, first = k, p.Last, false
		}
	}
	delete(w.pairs, oldest)
}
