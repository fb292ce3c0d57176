package metal

import (
	"maps"
	"slices"
	"testing"

	"bcd/internal/store"
)

// spreadPick takes by name without a key; with one, in turn from each of the label's values
// (in order, the nodes without it last), each value's nodes by name, a value that runs out
// dropping out of the turn; never more than there are.
func TestSpreadPick(t *testing.T) {
	node := func(name, rack string) store.Node {
		n := store.Node{ID: "id-" + name, Name: name}
		if rack != "-" {
			n.Labels = map[string]string{"rack": rack, "row": "a"}
		}
		return n
	}
	// Given out of order: the pick's order must not depend on it.
	pool := []store.Node{
		node("n7", "r1"), node("n2", "r2"), node("n1", "r1"), node("n9", "-"), node("n4", "r3"),
		node("n3", "r1"), node("n8", ""), node("n5", "r3"), node("n6", "r1"),
	}
	for _, tc := range []struct {
		name  string
		key   string
		count int
		want  []string
	}{
		{"by name", "", 4, []string{"n1", "n2", "n3", "n4"}},
		{"by name, more than there are", "", 20, []string{"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9"}},
		{"one turn", "rack", 4, []string{"n1", "n2", "n4", "n8"}},
		{"a value runs out", "rack", 7, []string{"n1", "n2", "n4", "n8", "n3", "n5", "n9"}},
		{"all of them", "rack", 9, []string{"n1", "n2", "n4", "n8", "n3", "n5", "n9", "n6", "n7"}},
		{"more than there are", "rack", 12, []string{"n1", "n2", "n4", "n8", "n3", "n5", "n9", "n6", "n7"}},
		{"a label all but one share", "row", 3, []string{"n1", "n9", "n2"}},
		{"a label no node has", "power", 3, []string{"n1", "n2", "n3"}},
		{"none asked", "rack", 0, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(pool)
			var got []string
			for _, n := range spreadPick(in, tc.key, tc.count) {
				got = append(got, n.Name)
			}
			if !slices.Equal(got, tc.want) && !(len(got) == 0 && len(tc.want) == 0) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			if !slices.EqualFunc(in, pool, func(a, b store.Node) bool { return a.Name == b.Name }) {
				t.Fatal("spreadPick reordered its input")
			}
		})
	}
	if got := spreadPick(nil, "rack", 3); len(got) != 0 {
		t.Fatalf("no nodes: %v", got)
	}
	counts := spreadCounts(spreadPick(pool, "rack", 7), "rack")
	if want := map[string]int{"r1": 2, "r2": 1, "r3": 2, "(none)": 2}; !maps.Equal(counts, want) {
		t.Fatalf("spreadCounts %v, want %v", counts, want)
	}
}

// A short count says how many of the nodes that could deploy had no inventory to check.
func TestUninspectedNote(t *testing.T) {
	for n, want := range map[int]string{
		0: "",
		1: "; 1 node that can deploy now has no inventory to check (bcd node inspect it)",
		7: "; 7 nodes that can deploy now have no inventory to check (bcd node inspect them)",
	} {
		if got := uninspectedNote(n); got != want {
			t.Errorf("uninspectedNote(%d) = %q, want %q", n, got, want)
		}
	}
}
