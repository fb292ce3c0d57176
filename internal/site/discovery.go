package site

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
)

// maxDiscovered bounds the machines remembered; the least recently seen goes first.
const maxDiscovered = 4096

// discoveries is the netboot.DiscoveryRecorder of the agent: machines that asked for a boot
// script with no entry, reported in the status until they get one. Safe for concurrent use.
type discoveries struct {
	has     func(mac string) bool // the MAC has an entry now
	changed func()

	mu   sync.Mutex
	seen map[string]agentlink.Discovered
}

func newDiscoveries(has func(string) bool, changed func()) *discoveries {
	return &discoveries{has: has, changed: changed, seen: map[string]agentlink.Discovered{}}
}

// RecordDiscovery implements netboot.DiscoveryRecorder.
func (d *discoveries) RecordDiscovery(_ context.Context, rec netboot.Discovery) error {
	mac := rec.MAC.String()
	d.mu.Lock()
	cur, ok := d.seen[mac]
	isNew := !ok || cur.UUID != rec.UUID || cur.Arch != rec.Arch
	if !ok {
		cur = agentlink.Discovered{MAC: mac, FirstSeen: rec.Time}
		if len(d.seen) >= maxDiscovered {
			d.evictLocked()
		}
	}
	cur.UUID, cur.Arch, cur.LastSeen = rec.UUID, rec.Arch, rec.Time
	d.seen[mac] = cur
	d.mu.Unlock()
	if isNew {
		d.changed()
	}
	return nil
}

func (d *discoveries) evictLocked() {
	var oldest string
	var at time.Time
	for m, r := range d.seen {
		if oldest == "" || r.LastSeen.Before(at) {
			oldest, at = m, r.LastSeen
		}
	}
	delete(d.seen, oldest)
}

// Snapshot lists the machines seen that still have no entry, by MAC; those that got one are
// forgotten.
func (d *discoveries) Snapshot() []agentlink.Discovered {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]agentlink.Discovered, 0, len(d.seen))
	for m, r := range d.seen {
		if d.has(m) {
			delete(d.seen, m)
			continue
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b agentlink.Discovered) int { return strings.Compare(a.MAC, b.MAC) })
	return out
}

// statusKey is what decides whether a new status report is due.
type statusKey struct {
	held       bool
	discovered string
}

func keyOf(s agentlink.Status) statusKey {
	var b strings.Builder
	for _, d := range s.Discovered {
		b.WriteString(d.MAC + "/" + d.UUID + "/" + d.Arch + ";")
	}
	return statusKey{held: s.HoldsBootLease, discovered: b.String()}
}
