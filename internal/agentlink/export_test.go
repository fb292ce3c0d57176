package agentlink

import (
	"os"
	"path/filepath"
	"testing"
)

// AppendReceived adds a "received" record to dir's journal, as an agent that crashed right
// after acknowledging a command would have left it.
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
