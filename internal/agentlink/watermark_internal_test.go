package agentlink

import (
	"fmt"
	"testing"
)

// newer: another store replaces the agent's watermark; the same store only further on (a later
// fence, or more beats since the same fence); an empty one never.
func TestStoreMarkNewer(t *testing.T) {
	cur := storeMark{StoreID: "s", Fences: 2, Beats: 100}
	for _, tc := range []struct {
		name string
		w    storeMark
		want bool
	}{
		{"same", cur, false},
		{"more beats", storeMark{StoreID: "s", Fences: 2, Beats: 101}, true},
		{"fewer beats", storeMark{StoreID: "s", Fences: 2, Beats: 99}, false},
		{"later fence, fewer beats", storeMark{StoreID: "s", Fences: 3, Beats: 1}, true},
		{"earlier fence, more beats", storeMark{StoreID: "s", Fences: 1, Beats: 500}, false},
		{"another store", storeMark{StoreID: "t"}, true},
		{"none", storeMark{}, false},
	} {
		if got := tc.w.newer(cur); got != tc.want {
			t.Errorf("%s: %+v newer than %+v = %v, want %v", tc.name, tc.w, cur, got, tc.want)
		}
	}
	if !(storeMark{StoreID: "s"}).newer(storeMark{}) {
		t.Error("a first watermark does not replace none")
	}
}

// The journal keeps the last command received and the store and fence it came under, across a
// reopen and a compaction (which writes the entries in no order); resumeAfter names it only
// under the same store and fence.
func TestJournalLastCommand(t *testing.T) {
	dir := t.TempDir()
	j, err := openJournal(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	s1f2 := storeMark{StoreID: "s1", Fences: 2, Beats: 9}
	for i := range 50 {
		id := fmt.Sprintf("c%03d", i)
		if _, _, err := j.receive([]Command{{ID: id, Kind: "bmc.query"}}, s1f2); err != nil {
			t.Fatal(err)
		}
		if err := j.finish(Update{CommandID: id, State: StateSucceeded}); err != nil {
			t.Fatal(err)
		}
		j.confirm(id)
	}
	if _, _, err := j.receive([]Command{{ID: "z-last", Kind: "bmc.query"}, {ID: "a-last", Kind: "bmc.query"}}, s1f2); err != nil {
		t.Fatal(err)
	}
	j.mu.Lock()
	err = j.compactLocked()
	j.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if err := j.close(); err != nil {
		t.Fatal(err)
	}
	j, err = openJournal(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	if id, m := j.last(); id != "a-last" || m != (storeMark{StoreID: "s1", Fences: 2}) {
		t.Fatalf("after a compaction and a reopen, last is %q under %+v, want a-last under s1 fence 2", id, m)
	}
	for _, tt := range []struct {
		mark storeMark
		want string
	}{
		{storeMark{StoreID: "s1", Fences: 2, Beats: 40}, "a-last"},
		{storeMark{StoreID: "s1", Fences: 3, Beats: 1}, ""}, // a fence since
		{storeMark{StoreID: "s2", Fences: 2}, ""},           // another store
		{storeMark{}, ""}, // none
	} {
		if got := resumeAfter(tt.mark, j); got != tt.want {
			t.Errorf("resumeAfter(%+v) = %q, want %q", tt.mark, got, tt.want)
		}
	}
}
