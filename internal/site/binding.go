package site

import (
	"fmt"
	"net/netip"
	"time"
)

// BootBinding says to which address the site agent serves a MAC's boot script (it carries the
// node's one-time token) and a node's metadata (its instance token).
type BootBinding string

const (
	// BindLease: only to the address the site's DHCP (proxy or full) saw that MAC take.
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
		return "", fmt.Errorf("boot binding %q needs the agent's DHCP (proxy or full): with DHCP off it never sees which address a machine takes; use %q", b, BindNone)
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
