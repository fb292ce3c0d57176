package site

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
)

// maxDiscovered bounds the machines remembered; the least recently seen goes first.
const maxDiscovered = 4096

// Inventories (discovery reports: self-asserted, posted by anyone on the provisioning network,
// up to netboot.MaxDiscoveryReport each) are bounded twice: what the agent keeps, and what one
// status report carries. The gateway refuses a frame over 16 MiB and the agent sends its status
// first on every stream, so an oversized status would cut the agent off for good.
const (
	// maxInventoryBytes bounds the inventories kept. A report that would pass it while the
	// inventories not yet sent fill it is refused (the ramdisk retries); sent ones make room.
	maxInventoryBytes = 16 << 20
	// reportInventoryBytes bounds the inventories one status report carries: those not yet
	// sent first, newest first, then those already sent; the others go without their
	// inventory, and those not yet sent in the next reports.
	reportInventoryBytes = 1 << 20
)

// errInventoriesFull refuses a discovery report while the inventories waiting to be sent fill
// what the agent keeps.
var errInventoriesFull = errors.New("too many discovery reports wait to be sent to the control plane; retry later")

// resightEvery is how often a machine still seen is reported again: the control plane learns
// that a MAC it already knew PXE-booted again (the sighting that follows a power cycle binds a
// MAC-less node's MAC, DESIGN §6).
const resightEvery = time.Minute

// sighting is a machine seen, and whether its inventory went out in a report since it last
// changed.
type sighting struct {
	agentlink.Discovered
	invSent bool
}

// discoveries is the netboot.DiscoveryRecorder of the agent: machines that asked for a boot
// script with no entry, reported in the status until they get one. Safe for concurrent use.
type discoveries struct {
	has     func(mac string) bool // the MAC has an entry now
	changed func()

	mu       sync.Mutex
	seen     map[string]*sighting
	reported map[string]time.Time // MAC → the sighting that last made a report due
	invBytes int                  // inventory bytes kept
	// rev changes whenever a status report is due: a sighting made one due, a machine was
	// forgotten, or a report took inventories not sent before. A machine's last sighting
	// moving alone does not change it.
	rev uint64
}

func newDiscoveries(has func(string) bool, changed func()) *discoveries {
	return &discoveries{has: has, changed: changed, seen: map[string]*sighting{}, reported: map[string]time.Time{}}
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
	if rec.Inventory != nil {
		old := 0
		if ok {
			old = len(cur.Inventory)
		}
		if !d.makeRoomLocked(len(rec.Inventory)-old, mac) {
			d.mu.Unlock()
			return fmt.Errorf("recording the discovery report of %s: %w", mac, errInventoriesFull)
		}
	}
	var known agentlink.Discovered
	if ok {
		known = cur.Discovered
	}
	isNew := reportDue(ok, known, d.reported[mac], rec) && rec.Inventory == nil
	if !ok {
		if len(d.seen) >= maxDiscovered {
			d.evictLocked()
		}
		cur = &sighting{Discovered: agentlink.Discovered{MAC: mac, FirstSeen: rec.Time}}
		d.seen[mac] = cur
	}
	if rec.Inventory != nil {
		// A discovery-mode ramdisk's report: the UUID and architecture iPXE saw stay.
		d.invBytes += len(rec.Inventory) - len(cur.Inventory)
		cur.Inventory, cur.LastSeen, cur.invSent = string(rec.Inventory), rec.Time, false
		isNew = true
	} else {
		cur.UUID, cur.Arch, cur.LastSeen = rec.UUID, rec.Arch, rec.Time
	}
	if isNew {
		d.reported[mac] = rec.Time
		d.rev++
	}
	d.mu.Unlock()
	if isNew {
		d.changed()
	}
	return nil
}

// makeRoomLocked makes room for grow more inventory bytes (for the report of except): it drops
// the inventories already sent, least recently seen first, as long as needed. False: the
// inventories not yet sent alone leave no room.
func (d *discoveries) makeRoomLocked(grow int, except string) bool {
	if d.invBytes+grow <= maxInventoryBytes {
		return true
	}
	var sent []*sighting
	unsent := 0
	for m, s := range d.seen {
		switch {
		case s.Inventory == "" || m == except:
		case s.invSent:
			sent = append(sent, s)
		default:
			unsent += len(s.Inventory)
		}
	}
	if unsent+grow > maxInventoryBytes {
		return false
	}
	slices.SortFunc(sent, func(a, b *sighting) int { return a.LastSeen.Compare(b.LastSeen) })
	for _, s := range sent {
		if d.invBytes+grow <= maxInventoryBytes {
			break
		}
		d.invBytes -= len(s.Inventory)
		s.Inventory = "" // the control plane has it
	}
	return d.invBytes+grow <= maxInventoryBytes
}

func (d *discoveries) evictLocked() {
	var oldest string
	var at time.Time
	for m, r := range d.seen {
		if oldest == "" || r.LastSeen.Before(at) {
			oldest, at = m, r.LastSeen
		}
	}
	if s := d.seen[oldest]; s != nil {
		d.invBytes -= len(s.Inventory)
	}
	delete(d.seen, oldest)
	delete(d.reported, oldest)
}

// Snapshot lists the machines seen that still have no entry, by MAC, each with its inventory;
// those that got one are forgotten. For tests: reports go through report.
func (d *discoveries) Snapshot() []agentlink.Discovered {
	return d.report(maxInventoryBytes).machines
}

// discoveryReport is what one status report carries of the machines seen.
type discoveryReport struct {
	machines []agentlink.Discovered // by MAC
	rev      uint64                 // discoveries.rev as of this report
	more     bool                   // inventories not yet sent remain: another report is due
}

// report lists the machines seen that still have no entry, by MAC (those that got one are
// forgotten), with at most budget bytes of inventories: those not sent before first, newest
// first, then those already sent, newest first. Those it carries count as sent.
func (d *discoveries) report(budget int) discoveryReport {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]agentlink.Discovered, 0, len(d.seen))
	var withInv []*sighting
	for m, s := range d.seen {
		if d.has(m) {
			d.invBytes -= len(s.Inventory)
			delete(d.seen, m)
			delete(d.reported, m)
			d.rev++
			continue
		}
		if s.Inventory != "" {
			withInv = append(withInv, s)
		}
	}
	slices.SortFunc(withInv, func(a, b *sighting) int {
		if a.invSent != b.invSent {
			if !a.invSent {
				return -1
			}
			return 1
		}
		return cmp.Or(b.LastSeen.Compare(a.LastSeen), strings.Compare(a.MAC, b.MAC))
	})
	carried := make(map[string]bool, len(withInv))
	more, marked, full := false, false, budget
	for _, s := range withInv {
		if len(s.Inventory) > budget {
			// Not this time; one larger than any report could carry is never sent.
			more = more || (!s.invSent && len(s.Inventory) <= full)
			continue
		}
		budget -= len(s.Inventory)
		carried[s.MAC] = true
		if !s.invSent {
			s.invSent, marked = true, true
		}
	}
	if marked {
		d.rev++ // this report differs from the last one
	}
	for m, s := range d.seen {
		r := s.Discovered
		if !carried[m] {
			r.Inventory = ""
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b agentlink.Discovered) int { return strings.Compare(a.MAC, b.MAC) })
	return discoveryReport{machines: out, rev: d.rev, more: more}
}

// resend makes every inventory kept go out again (a new stream to the control plane: a report
// that carried some may have been lost with the old one).
func (d *discoveries) resend() {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, s := range d.seen {
		if s.Inventory != "" && s.invSent {
			s.invSent = false
			n++
		}
	}
	if n > 0 {
		d.rev++
	}
}

// statusKey is what decides whether a new status report is due.
type statusKey struct {
	held       bool
	discovered uint64 // discoveries.rev
	withheld   string
	facts      string // the facts (the cache's counts change with downloads and evictions)
}

func keyOf(s agentlink.Status, discoveredRev uint64) statusKey {
	var w strings.Builder
	for _, p := range s.Withheld {
		// A new episode is sent; its count growing alone is not (a machine retrying every few
		// seconds would send a report each time).
		fmt.Fprintf(&w, "%s/%s/%d;", p.MAC, p.Remote, p.First.UnixMilli())
	}
	var f strings.Builder
	for _, k := range slices.Sorted(maps.Keys(s.Facts)) {
		fmt.Fprintf(&f, "%s=%s;", k, s.Facts[k])
	}
	return statusKey{held: s.HoldsBootLease, discovered: discoveredRev, withheld: w.String(), facts: f.String()}
}
