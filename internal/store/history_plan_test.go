package store

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// History retention finds the ended workflows and batches through their indexes, oldest first,
// not by reading every workflow or batch ever made and sorting them.
func TestPurgeHistoryUsesItsIndex(t *testing.T) {
	s, err := Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "bcd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct{ query, index string }{
		{endedWorkflowsQuery, "workflows_ended"},
		{endedBatchesQuery, "batches_state"},
		{looseCommandsQuery(SQLite), "commands_loose"},
	} {
		got := planOf(t, s, c.query, int64(1), 1)
		if !strings.Contains(got, "INDEX "+c.index) || strings.Contains(got, "TEMP B-TREE") {
			t.Errorf("plan %q, want a search of %s in order", got, c.index)
		}
	}
}
