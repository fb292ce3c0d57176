package agentlink

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestJournalReplayTornAndCorrupt(t *testing.T) {
	var good []byte
	good = appendRecord(good, receivedRecord(Command{ID: "a", Kind: "bmc.power", Args: []byte(`{}`)}, storeMark{}))
	good = appendRecord(good, finalRecord(Update{CommandID: "a", State: StateSucceeded, Result: []byte(`{"x":1}`), NodeSig: []byte{1}}))
	good = appendRecord(good, record{Op: opConfirmed, ID: "a"})
	good = appendRecord(good, receivedRecord(Command{ID: "b", Kind: "bmc.query"}, storeMark{}))
	flipped := bytes.Clone(good)
	flipped[20] ^= 0xff
	for _, tc := range []struct {
		name    string
		data    []byte
		records int
		good    int
		corrupt bool
	}{
		{"empty", nil, 0, 0, false},
		{"whole", good, 4, len(good), false},
		{"torn header", append(bytes.Clone(good), 0, 0, 0), 4, len(good), false},
		{"torn payload", good[:len(good)-3], 3, len(good) - len(appendRecord(nil, receivedRecord(Command{ID: "b", Kind: "bmc.query"}, storeMark{}))), false},
		{"damage before the end", flipped, 0, 0, true},
		{"huge length", append([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}, good...), 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recs, n, err := decodeJournal(tc.data)
			if tc.corrupt {
				if !errors.Is(err, errJournalCorrupt) {
					t.Fatalf("err %v, want corrupt", err)
				}
				return
			}
			if err != nil || len(recs) != tc.records || n != tc.good {
				t.Fatalf("%d records, good %d, err %v; want %d, %d", len(recs), n, err, tc.records, tc.good)
			}
		})
	}

	// Opening a torn journal truncates the tail; a corrupt one refuses to open.
	dir := t.TempDir()
	path := filepath.Join(dir, JournalFile)
	if err := os.WriteFile(path, good[:len(good)-3], 0o600); err != nil {
		t.Fatal(err)
	}
	j, err := openJournal(dir, 10)
	if err != nil {
		t.Fatal(err)
	}
	if ran, never := j.unfinished(); len(ran)+len(never) != 0 {
		t.Errorf("unfinished %v %v", ran, never)
	}
	if _, err := j.finish(Update{CommandID: "c", State: StateFailed}), j.close(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if recs, n, err := decodeJournal(data); err != nil || n != len(data) || len(recs) != 4 {
		t.Fatalf("after truncate and append: %d records, %d/%d, %v", len(recs), n, len(data), err)
	}
	if err := os.WriteFile(path, flipped, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := openJournal(dir, 10); !errors.Is(err, errJournalCorrupt) {
		t.Fatalf("opened a corrupt journal: %v", err)
	}
}

func TestJournalCompactionKeepsWhatMatters(t *testing.T) {
	dir := t.TempDir()
	j, err := openJournal(dir, 100)
	if err != nil {
		t.Fatal(err)
	}
	j.minCompact = 500
	const n = 1500
	for i := range n {
		id := fmt.Sprintf("c%05d", i)
		fresh, known, err := j.receive([]Command{{ID: id, Kind: "k"}}, storeMark{})
		if err != nil || len(fresh) != 1 || len(known) != 0 {
			t.Fatal(fresh, known, err)
		}
		if i%500 == 499 {
			continue // left unfinished, never started
		}
		if i%500 == 498 {
			if err := j.start(id); err != nil {
				t.Fatal(err)
			}
			continue // left unfinished, started
		}
		if err := j.finish(Update{CommandID: id, State: StateSucceeded, Result: []byte(`{"big":"` + id + `"}`)}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			j.confirm(id)
		}
	}
	before := len(j.unconfirmed())
	if err := j.close(); err != nil {
		t.Fatal(err)
	}
	j2, err := openJournal(dir, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer j2.close()
	if got := len(j2.unconfirmed()); got != before {
		t.Errorf("unconfirmed after reopen %d, want %d", got, before)
	}
	if ran, never := j2.unfinished(); len(ran) != 3 || len(never) != 3 {
		t.Errorf("unfinished: %d ran, %d never; want 3 and 3", len(ran), len(never))
	}
	if len(j2.confirmed) != 100 {
		t.Errorf("retained %d confirmed ids, want 100", len(j2.confirmed))
	}
	// A retained id is still known; an unconfirmed final keeps its result.
	_, known, _ := j2.receive([]Command{{ID: "c01498"}, {ID: "c00001"}}, storeMark{})
	if len(known) != 2 || known[1].final == nil || string(known[1].final.Result) != `{"big":"c00001"}` {
		t.Errorf("known %+v", known)
	}
	if j2.records > 4*(n/2+100) {
		t.Errorf("journal holds %d records: not compacted", j2.records)
	}
}

func FuzzDecodeJournal(f *testing.F) {
	var seed []byte
	seed = appendRecord(seed, receivedRecord(Command{ID: "a", Kind: "disk.wipe", Args: []byte(`{"mode":"quick"}`), Attest: true}, storeMark{}))
	seed = appendRecord(seed, finalRecord(Update{CommandID: "a", State: StateSucceeded, Result: []byte(`{}`)}))
	f.Add(seed)
	f.Add(seed[:len(seed)-1])
	f.Add([]byte{0, 0, 0, 2, 0, 0, 0, 0, '{', '}'})
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, good, err := decodeJournal(data)
		if err != nil {
			return
		}
		if good < 0 || good > len(data) {
			t.Fatalf("good %d of %d", good, len(data))
		}
		// The intact prefix decodes to the same records, whole.
		again, good2, err := decodeJournal(data[:good])
		if err != nil || good2 != good || !reflect.DeepEqual(again, recs) {
			t.Fatalf("prefix decodes differently: %v", err)
		}
		// Replaying never panics and is idempotent.
		j := &journal{entries: map[string]*jentry{}}
		for _, r := range append(recs, recs...) {
			j.apply(r)
		}
	})
}

// The journal tells, after a restart, the unfinished commands that may have run from those
// that never started; a journal written before starts were recorded claims nothing.
func TestJournalKnowsWhatRan(t *testing.T) {
	old := receivedRecord(Command{ID: "old", Kind: "bmc.power"}, storeMark{})
	old.Starts = false // as written before start records existed
	for _, tc := range []struct {
		name    string
		records []record
		ran     bool
	}{
		{"received", []record{receivedRecord(Command{ID: "c"}, storeMark{})}, false},
		{"started", []record{receivedRecord(Command{ID: "c"}, storeMark{}), {Op: opStarted, ID: "c"}}, true},
		{"an old journal's record", []record{old}, true},
		{"finished", []record{receivedRecord(Command{ID: "c"}, storeMark{}), {Op: opStarted, ID: "c"}, finalRecord(Update{CommandID: "c", State: StateSucceeded})}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var data []byte
			for _, r := range tc.records {
				data = appendRecord(data, r)
			}
			if err := os.WriteFile(filepath.Join(dir, JournalFile), data, 0o600); err != nil {
				t.Fatal(err)
			}
			j, err := openJournal(dir, 10)
			if err != nil {
				t.Fatal(err)
			}
			defer j.close()
			ran, never := j.unfinished()
			finished := tc.records[len(tc.records)-1].Op == opFinal
			switch {
			case finished && len(ran)+len(never) != 0:
				t.Errorf("a finished command is unfinished: ran %v, never %v", ran, never)
			case !finished && tc.ran && (len(ran) != 1 || len(never) != 0):
				t.Errorf("ran %v, never %v: want it among those that may have run", ran, never)
			case !finished && !tc.ran && (len(ran) != 0 || len(never) != 1):
				t.Errorf("ran %v, never %v: want it among those that never ran", ran, never)
			}
		})
	}
}

// A command's arguments (one-time tokens, BMC credentials sealed to the agent's key) are kept
// only while the command may still have to run: once it started or ended they are forgotten,
// and the file drops them at its next compaction (at the latest an hour later, or at open). A
// command that never started keeps them across a restart, to run.
func TestJournalForgetsSpentArguments(t *testing.T) {
	dir := t.TempDir()
	j, err := openJournal(dir, 100)
	if err != nil {
		t.Fatal(err)
	}
	secret := func(id string) []byte {
		return []byte(`{"credentials":"jwe-of-` + id + `","token":"tok-of-` + id + `"}`)
	}
	cmds := []Command{{ID: "ended", Kind: "bmc.power", Args: secret("ended")}, {ID: "started", Kind: "bmc.power", Args: secret("started")},
		{ID: "waiting", Kind: "bmc.power", Args: secret("waiting")}}
	if _, _, err := j.receive(cmds, storeMark{}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"ended", "started"} {
		if err := j.start(id); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.finish(Update{CommandID: "ended", State: StateSucceeded}); err != nil {
		t.Fatal(err)
	}
	j.confirm("ended")
	for id, want := range map[string]bool{"ended": false, "started": false, "waiting": true} {
		if got := len(j.entries[id].cmd.Args) > 0; got != want {
			t.Errorf("%s: arguments kept %v, want %v", id, got, want)
		}
	}
	if err := j.close(); err != nil {
		t.Fatal(err)
	}
	// At open the spent arguments are compacted away; the waiting command's stay.
	j, err = openJournal(dir, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer j.close()
	data, err := os.ReadFile(filepath.Join(dir, JournalFile))
	if err != nil {
		t.Fatal(err)
	}
	recs, _, err := decodeJournal(data)
	if err != nil {
		t.Fatal(err)
	}
	held := map[string]bool{}
	for _, r := range recs {
		if len(r.Args) > 0 {
			held[r.ID] = true
		}
	}
	if want := map[string]bool{"waiting": true}; !reflect.DeepEqual(held, want) {
		t.Errorf("after reopening, the file holds the arguments of %v, want only %v", held, want)
	}
	ran, never := j.unfinished()
	if len(ran) != 1 || ran[0].ID != "started" || len(never) != 1 || never[0].ID != "waiting" || !bytes.Equal(never[0].Args, secret("waiting")) {
		t.Fatalf("unfinished after reopening: ran %v, never %v", ran, never)
	}
}
