package sim

import (
	"maps"
	"testing"
	"time"

	"bcd/internal/store"
)

func TestExecCounts(t *testing.T) {
	ids := []string{store.NewID(time.Now()), store.NewID(time.Now()), "cmd-1",
		"0190AAAA-0000-7000-8000-000000000000", // upper case: not canonical, kept as given
		"0190aaaa-0000-7000-8000-00000000000",  // one digit short
		"0190aaaa00000-7000-8000-000000000000", // a dash missing
	}
	e := newExecCounts()
	want := map[string]int{}
	for i, id := range ids {
		for range i%2 + 1 {
			e.add(id)
			want[id]++
		}
	}
	if got := e.all(); !maps.Equal(got, want) {
		t.Errorf("all() = %v, want %v", got, want)
	}
	commands, twice := e.summary()
	if commands != len(ids) || twice != len(ids)/2 {
		t.Errorf("summary() = %d commands, %d ran twice; want %d, %d", commands, twice, len(ids), len(ids)/2)
	}
	if _, ok := parseUUID(ids[3]); ok {
		t.Errorf("parseUUID(%q) accepted upper case: store.FormatUUID would not give it back", ids[3])
	}
	if u, ok := parseUUID(ids[0]); !ok || store.FormatUUID(u) != ids[0] {
		t.Errorf("parseUUID(%q) = %x, %v: not given back by store.FormatUUID", ids[0], u, ok)
	}
}
