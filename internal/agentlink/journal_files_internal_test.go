package agentlink

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// openDescriptors counts this process's descriptors open on path (Linux's /proc).
func openDescriptors(t *testing.T, path string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && target == path {
			n++
		}
	}
	return n
}

// An agent's journal is open only while a batch is written: between commands it holds no
// descriptor (a simulation runs thousands of agents in one process under one limit), what it
// wrote is all there when reopened, and nothing is journaled once it is closed.
func TestJournalHoldsNoFileBetweenWrites(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, JournalFile)
	j, err := openJournal(dir, 10)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		do   func() error
	}{
		{"opened", func() error { return nil }},
		{"received", func() error {
			_, _, err := j.receive([]Command{{ID: "a", Kind: "bmc.power"}, {ID: "b", Kind: "bmc.boot"}}, storeMark{})
			return err
		}},
		{"started", func() error { return j.start("a") }},
		{"finished", func() error { return j.finish(Update{CommandID: "a", State: StateSucceeded}) }},
		{"confirmed (pending)", func() error { j.confirm("a"); return nil }},
		{"forgotten (pending)", func() error { j.forget("b"); return nil }},
		{"compacted", func() error {
			j.mu.Lock()
			defer j.mu.Unlock()
			return j.compactLocked()
		}},
		{"closed", j.close},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if n := openDescriptors(t, path); n != 0 {
			t.Fatalf("%s: %d descriptors open on the journal, want 0", s.name, n)
		}
	}
	if _, _, err := j.receive([]Command{{ID: "c", Kind: "bmc.power"}}, storeMark{}); !errors.Is(err, errJournalClosed) {
		t.Fatalf("receive after close: %v, want %v", err, errJournalClosed)
	}
	again, err := openJournal(dir, 10)
	if err != nil {
		t.Fatal(err)
	}
	ran, never := again.unfinished()
	if len(ran)+len(never) != 0 {
		t.Errorf("reopened: unfinished %v / %v, want none (a finished, b forgotten, c refused)", ran, never)
	}
	if got := again.unconfirmed(); len(got) != 0 {
		t.Errorf("reopened: unconfirmed %v, want none (a's confirmation was written at close)", got)
	}
	if e := again.entries["a"]; e == nil || !e.confirmed || e.final == nil || e.final.State != StateSucceeded {
		t.Errorf("reopened: a is %+v, want succeeded and confirmed", e)
	}
}
