package store

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// History retention finds the ended workflows through their index (workflows_ended), oldest
// first, not by reading every workflow ever run and sorting them.
func TestPurgeHistoryUsesItsIndex(t *testing.T) {
	s, err := Open(context.Background(), "sqlite://"+filepath.Join(t.TempDir(), "bcd.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got := planOf(t, s, endedWorkflowsQuery, int64(1), 1)
	if !strings.Contains(got, "INDEX workflows_ended") || strings.Contains(got, "TEMP B-TREE") {
		t.Fatalf("plan %q, want a search of workflows_ended in order", got)
	}
}
