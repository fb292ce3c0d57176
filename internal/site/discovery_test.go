package site

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
)

// TestDiscoveriesReportResightings: a new machine, a changed UUID or architecture, and a machine
// seen again a minute after its last report make a status report due; repeats in between do not
// (their last sighting moves, and the status key stays).
func TestDiscoveriesReportResightings(t *testing.T) {
	mac, _ := net.ParseMAC("52:54:00:12:34:56")
	t0 := time.Unix(1_700_000_000, 0)
	const uuid = "00112233-4455-6677-8899-aabbccddeeff"
	steps := []struct {
		name string
		at   time.Duration
		uuid string
		arch string
		due  bool
	}{
		{"first sighting", 0, uuid, "x86_64", true},
		{"the wait script's retry", 5 * time.Second, uuid, "x86_64", false},
		{"another retry", 59 * time.Second, uuid, "x86_64", false},
		{"a minute after the report", 60 * time.Second, uuid, "x86_64", true},
		{"soon after", 70 * time.Second, uuid, "x86_64", false},
		{"UUID changed", 71 * time.Second, "33221100-5544-7766-8899-aabbccddeeff", "x86_64", true},
		{"architecture changed", 72 * time.Second, "33221100-5544-7766-8899-aabbccddeeff", "arm64", true},
		{"quiet again", 80 * time.Second, "33221100-5544-7766-8899-aabbccddeeff", "arm64", false},
		{"back after a power cycle", 10 * time.Minute, "33221100-5544-7766-8899-aabbccddeeff", "arm64", true},
	}
	changes := 0
	d := newDiscoveries(func(string) bool { return false }, func() { changes++ })
	var lastKey statusKey
	for _, s := range steps {
		before := changes
		if err := d.RecordDiscovery(context.Background(), netboot.Discovery{MAC: mac, UUID: s.uuid, Arch: s.arch, Time: t0.Add(s.at)}); err != nil {
			t.Fatal(err)
		}
		if got := changes > before; got != s.due {
			t.Errorf("%s: report due %v, want %v", s.name, got, s.due)
		}
		rep := d.report(reportInventoryBytes)
		snap := rep.machines
		if len(snap) != 1 || !snap[0].FirstSeen.Equal(t0) || !snap[0].LastSeen.Equal(t0.Add(s.at)) {
			t.Fatalf("%s: snapshot %+v", s.name, snap)
		}
		k := keyOf(agentlink.Status{Discovered: snap}, rep.rev)
		if changed := k != lastKey; changed != s.due {
			t.Errorf("%s: the status key changed %v, want %v (a report is sent when it changes)", s.name, changed, s.due)
		}
		lastKey = k
	}
	// A machine that got an entry is forgotten, and reported anew when seen again.
	d.has = func(string) bool { return true }
	if len(d.Snapshot()) != 0 {
		t.Fatal("a machine with an entry is still reported")
	}
	d.has = func(string) bool { return false }
	before := changes
	d.RecordDiscovery(context.Background(), netboot.Discovery{MAC: mac, UUID: uuid, Arch: "x86_64", Time: t0.Add(11 * time.Minute)})
	if changes == before {
		t.Error("a forgotten machine seen again is not reported")
	}
}

// inventoryOf is a discovery report's document of about size bytes for mac.
func inventoryOf(mac string, size int) []byte {
	return fmt.Appendf(nil, `{"bootMac":%q,"disks":%q}`, mac, strings.Repeat("x", max(size-40, 0)))
}

// TestDiscoveryInventoriesBounded: inventories posted by anyone on the provisioning network are
// kept up to maxInventoryBytes (a report beyond, while those not yet sent fill it, is refused)
// and go out at most reportInventoryBytes per status report, those not yet sent first and newest
// first, until every one was sent; machines whose inventory does not fit still go, without it.
// Sent inventories make room for new ones, and a new stream sends them all again.
func TestDiscoveryInventoriesBounded(t *testing.T) {
	const size = 60 << 10
	t0 := time.Unix(1_700_000_000, 0)
	d := newDiscoveries(func(string) bool { return false }, func() {})
	accepted, refused := 0, 0
	for i := range 400 {
		hw := net.HardwareAddr{2, 0, 0, 0, byte(i >> 8), byte(i)}
		err := d.RecordDiscovery(context.Background(), netboot.Discovery{MAC: hw, Time: t0.Add(time.Duration(i) * time.Second), Inventory: inventoryOf(hw.String(), size)})
		switch {
		case err == nil:
			accepted++
		case errors.Is(err, errInventoriesFull):
			refused++
		default:
			t.Fatal(err)
		}
	}
	if accepted*size > maxInventoryBytes || accepted < maxInventoryBytes/size-1 || refused == 0 {
		t.Fatalf("%d reports of %d bytes accepted, %d refused; the bound is %d bytes", accepted, size, refused, maxInventoryBytes)
	}

	sent := map[string]bool{}
	var lastRev uint64
	reports := 0
	for rep := d.report(reportInventoryBytes); ; rep = d.report(reportInventoryBytes) {
		reports++
		if len(rep.machines) != accepted {
			t.Fatalf("report %d lists %d machines, want %d", reports, len(rep.machines), accepted)
		}
		carried, newest := 0, time.Time{}
		for _, m := range rep.machines {
			if m.Inventory == "" {
				continue
			}
			carried += len(m.Inventory)
			if !sent[m.MAC] && m.LastSeen.After(newest) {
				newest = m.LastSeen
			}
			sent[m.MAC] = true
		}
		if carried > reportInventoryBytes {
			t.Fatalf("report %d carries %d bytes of inventories, more than %d", reports, carried, reportInventoryBytes)
		}
		if reports > 1 && rep.rev == lastRev && rep.more {
			t.Fatalf("report %d: a report carrying new inventories has the last one's key", reports)
		}
		lastRev = rep.rev
		if !rep.more {
			break
		}
		if reports > 2*accepted {
			t.Fatal("the reports never carried every inventory")
		}
	}
	if len(sent) != accepted {
		t.Fatalf("%d inventories sent of %d", len(sent), accepted)
	}
	if want := (accepted*size + reportInventoryBytes - 1) / reportInventoryBytes; reports > want+1 {
		t.Errorf("%d reports to send %d inventories, want about %d", reports, accepted, want)
	}
	// Once sent, a quiet agent's reports stay the same.
	if rep := d.report(reportInventoryBytes); rep.rev != lastRev || rep.more {
		t.Errorf("nothing changed, yet the key moved (%d → %d) or more is due", lastRev, rep.rev)
	}
	// Sent inventories make room: a report refused before is accepted now.
	hw := net.HardwareAddr{2, 0, 0, 0, 0xff, 0xff}
	if err := d.RecordDiscovery(context.Background(), netboot.Discovery{MAC: hw, Time: t0.Add(time.Hour), Inventory: inventoryOf(hw.String(), size)}); err != nil {
		t.Fatalf("a report once the others were sent: %v", err)
	}
	if rep := d.report(reportInventoryBytes); !slices.ContainsFunc(rep.machines, func(m agentlink.Discovered) bool { return m.MAC == hw.String() && m.Inventory != "" }) {
		t.Error("the newest inventory did not go out first")
	}
	// A new stream: every inventory kept goes out again.
	d.resend()
	if rep := d.report(reportInventoryBytes); !rep.more {
		t.Error("after resend, no inventory is due again")
	}
}
