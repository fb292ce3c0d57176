package site

import (
	"context"
	"net"
	"testing"
	"time"

	"bcd/internal/agentlink"
	"bcd/internal/netboot"
)

// TestDiscoveriesReportResightings: a new machine, a changed UUID or architecture, and a machine
// seen again a minute after its last report make a status report due; repeats in between do not.
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
		snap := d.Snapshot()
		if len(snap) != 1 || !snap[0].FirstSeen.Equal(t0) || !snap[0].LastSeen.Equal(t0.Add(s.at)) {
			t.Fatalf("%s: snapshot %+v", s.name, snap)
		}
		if s.due {
			k := keyOf(agentlink.Status{Discovered: snap})
			if k == lastKey {
				t.Errorf("%s: the status key did not change, the report would not be sent", s.name)
			}
			lastKey = k
		}
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
