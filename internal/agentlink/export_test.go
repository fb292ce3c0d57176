package agentlink

import (
	"os"
	"path/filepath"
	"testing"
)

// AppendReceived adds a "received" record to dir's journal without start tracking, as an agent
// that crashed while running a command would have left it before starts were journaled: the
// command may have run.
func AppendReceived(t *testing.T, dir, id string) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(dir, JournalFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(appendRecord(nil, record{Op: opReceived, ID: id, Kind: "bmc.power"})); err != nil {
		t.Fatal(err)
	}
}

// OpenConns is how many of the link's gateway connections are open.
func (l *Link) OpenConns() int {
	l.conns.mu.Lock()
	defer l.conns.mu.Unlock()
	return len(l.conns.conns)
}
