package site

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
)

// maxDiscovered bounds the machines remembered; the least recently seen goes first.
const maxDiscovered = 4096

// resightEvery is how often a machine still seen is reported again: the control plane learns
// that a MAC it already knew PXE-booted again (the sighting that follows a power cycle binds a
// MAC-less node's MAC, DESIGN §6).
const resightEvery = time.Minute

// discoveries is the netboot.DiscoveryRecorder of the agent: machines that asked for a boot
// script with no entry, reported in the status until they get one. Safe for concurrent use.
type discoveries struct {
	has     func(mac string) bool // the MAC has an entry now
	changed func()

	mu       sync.Mutex
	seen     map[string]agentlink.Discovered
	reported map[string]time.Time // MAC → the sighting that last made a report due
}

func newDiscoveries(has func(string) bool, changed func()) *discoveries {
	return &discoveries{has: has, changed: changed, seen: map[string]agentlink.Discovered{}, reported: map[string]time.Time{}}
}

// reportDue says whether a sighting makes a new status report due: a new machine, a changed
// UUID or architecture, or one last reported resightEvery ago. Pure.
func reportDue(known bool, cur agentlink.Discovered, lastReport time.Time, rec netboot.Discovery) bool {
	return !known || cur.UUID != rec.UUID || cur.Arch != rec.Arch || rec.Time.Sub(lastReport) >= resightEvery
}

// RecordDiscovery implements netboot.DiscoveryRecorder.
func (d *discoveries) RecordDiscovery(_ context.Context, rec netboot.Discovery) error {
	mac := rec.MAC.String()
	d.mu.Lock()
	cur, ok := d.seen[mac]
	isNew := reportDue(ok, cur, d.reported[mac], rec) && rec.Inventory == nil
	if !ok {
		cur = agentlink.Discovered{MAC: mac, FirstSeen: rec.Time}
		if len(d.seen) >= maxDiscovered {
			d.evictLocked()
		}
	}
	if rec.Inventory != nil {
		// A discovery-mode ramdisk's report: the UUID and architecture iPXE saw stay.
		cur.Inventory, cur.LastSeen = string(rec.Inventory), rec.Time
		isNew = true
	} else {
		cur.UUID, cur.Arch, cur.LastSeen = rec.UUID, rec.Arch, rec.Time
	}
	d.seen[mac] = cur
	if isNew {
		d.reported[mac] = rec.Time
	}
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
	delete(d.reported, oldest)
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
			delete(d.reported, m)
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
	withheld   string
}

func keyOf(s agentlink.Status) statusKey {
	var b strings.Builder
	for _, d := range s.Discovered {
		// The last sighting is part of the key: a re-sighting made due is sent.
		h := fnv.New64a()
		h.Write([]byte(d.Inventory))
		fmt.Fprintf(&b, "%s/%s/%s/%d/%x;", d.MAC, d.UUID, d.Arch, d.LastSeen.Unix(), h.Sum64())
	}
	var w strings.Builder
	for _, p := range s.Withheld {
		// A new episode is sent; its count growing alone is not (a machine retrying every few
		// seconds would send a report each time).
		fmt.Fprintf(&w, "%s/%s/%d;", p.MAC, p.Remote, p.First.UnixMilli())
	}
	return statusKey{held: s.HoldsBootLease, discovered: b.String(), withheld: w.String()}
}
