package engine

import (
	"testing"
	"time"

	"bcd/internal/command"
	"bcd/internal/store"
)

// decidePoll over every kind of reading against every kind of record.
func TestDecidePoll(t *testing.T) {
	const at, threshold = 500, 3
	ok := func(p string) PowerReading { return PowerReading{NodeID: "n", Power: p} }
	fail := func(n int) PowerReading { return PowerReading{NodeID: "n", Error: "timeout", Failures: n} }
	fresh := store.PowerPoll{NodeID: "n"}
	failing := func(n int) store.PowerPoll { return store.PowerPoll{NodeID: "n", Failures: n, LastError: "timeout"} }
	raised := store.PowerPoll{NodeID: "n", Failures: 5, UnreachableSince: 100, LastError: "timeout"}
	cases := []struct {
		name      string
		prev      store.PowerPoll
		stored    string
		r         PowerReading
		setPower  string
		failures  int
		since     int64
		raise     bool
		clear     bool
		lastError string
	}{
		{"first reading, same power", fresh, "on", ok("on"), "", 0, 0, false, false, ""},
		{"first reading, power changed", fresh, "unknown", ok("off"), "off", 0, 0, false, false, ""},
		{"answer after failures below threshold", failing(2), "on", ok("on"), "", 0, 0, false, false, ""},
		{"answer while raised clears", raised, "on", ok("off"), "off", 0, 0, false, true, ""},
		{"first failure", fresh, "on", fail(1), "", 1, 0, false, false, "timeout"},
		{"failure below threshold", failing(1), "on", fail(2), "", 2, 0, false, false, "timeout"},
		{"failure reaching threshold raises", failing(2), "on", fail(3), "", 3, at, true, false, "timeout"},
		{"coalesced failures reach threshold at once", fresh, "on", fail(4), "", 4, at, true, false, "timeout"},
		{"agent's count restarted (new holder): ours goes on", failing(2), "on", fail(1), "", 3, at, true, false, "timeout"},
		{"failure while raised raises nothing again", raised, "on", fail(6), "", 6, 100, false, false, "timeout"},
	}
	for _, c := range cases {
		o := decidePoll(c.prev, c.stored, c.r, threshold, at)
		if o.setPower != c.setPower || o.next.Failures != c.failures || o.next.UnreachableSince != c.since || o.raise != c.raise ||
			o.clear != c.clear || o.next.LastError != c.lastError {
			t.Errorf("%s: got %+v", c.name, o)
		}
		if c.r.Power != "" && o.next.LastOKAt != at {
			t.Errorf("%s: last OK %d, want %d", c.name, o.next.LastOKAt, at)
		}
	}
}

func TestClampTTL(t *testing.T) {
	for in, want := range map[time.Duration]time.Duration{0: 10 * time.Second, -time.Second: 10 * time.Second, time.Millisecond: time.Second,
		15 * time.Second: 15 * time.Second, time.Hour: 5 * time.Minute} {
		if got := clampTTL(in); got != want {
			t.Errorf("clampTTL(%s) = %s, want %s", in, got, want)
		}
	}
}

// The holder-only kinds are exactly the command table's boot-lease kinds, and each leaves an entry
// at claim — except bmc.media, routed to the holder for its sanboot fallback, whose entry is
// known only from its result (MediaEntry, recorded when the workflow takes the result).
func TestHolderKinds(t *testing.T) {
	got := map[string]bool{}
	for _, k := range holderKinds() {
		got[k] = true
		if bootEntryKind(k) == "" && k != "bmc.media" {
			t.Errorf("%s runs on the holder but leaves no boot entry", k)
		}
	}
	for _, k := range command.Kinds() {
		if got[k.Name] != k.BootLeaseHolder {
			t.Errorf("%s: holder-only %t, kind table says %t", k.Name, got[k.Name], k.BootLeaseHolder)
		}
		if !k.BootLeaseHolder && bootEntryKind(k.Name) != "" {
			t.Errorf("%s leaves a boot entry but is not a holder kind", k.Name)
		}
	}
}
