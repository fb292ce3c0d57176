package agentlink

import "testing"

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
