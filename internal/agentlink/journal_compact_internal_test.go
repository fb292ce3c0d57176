package agentlink

import (
	"testing"
)

// A compaction rewrites the journal from what it knows, which already includes the records not
// yet written (confirmations are not waited for). Written after the compacted image, those
// records named entries the compaction had pruned: replayed at the next start, a confirmation
// of a pruned command made an entry with no final update, taken for a command interrupted by
// the restart and reported so (and counted against the retained ones, pushing out real ones).
func TestCompactionLeavesNoGhosts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		retain int
		ids    []string
	}{
		{"retain one of two", 1, []string{"a", "b"}},
		{"retain two of five", 2, []string{"a", "b", "c", "d", "e"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			j, err := openJournal(dir, tc.retain)
			if err != nil {
				t.Fatal(err)
			}
			j.minCompact = 1
			var cmds []Command
			for _, id := range tc.ids {
				cmds = append(cmds, Command{ID: id, Kind: "bmc.power"})
			}
			if _, _, err := j.receive(cmds, storeMark{}); err != nil {
				t.Fatal(err)
			}
			for _, id := range tc.ids {
				if err := j.start(id); err != nil {
					t.Fatal(err)
				}
				if err := j.finish(Update{CommandID: id, State: StateSucceeded, Result: []byte(`{}`)}); err != nil {
					t.Fatal(err)
				}
			}
			for _, id := range tc.ids {
				j.confirm(id) // not waited for: pending when the last one compacts
			}
			if err := j.close(); err != nil {
				t.Fatal(err)
			}
			j, err = openJournal(dir, tc.retain)
			if err != nil {
				t.Fatal(err)
			}
			defer j.close()
			if ran, never := j.unfinished(); len(ran)+len(never) != 0 {
				t.Errorf("after a restart, unfinished: ran %v, never %v; want none", ran, never)
			}
			last := tc.ids[len(tc.ids)-1]
			if e, ok := j.entries[last]; !ok || e.final == nil || !e.confirmed {
				t.Errorf("the last confirmed command %s is not kept whole: %+v", last, e)
			}
		})
	}
}
