package sim

import (
	"context"
	"strings"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// Every statement SQLite's writer runs through the machines' lives keeps the plan it was
// prepared with. A statement whose plan hangs on a value bound to one of its parameters (a
// parameter compared with a column that a partial index's WHERE names) is prepared again at
// every run: tens of microseconds of the writer each time. The wipe's proof read at release
// was one (`workflow_id = ?` weighed against commands_loose, whose WHERE asks for an empty
// workflow_id), 80 µs a node.
func TestWriterStatementsKeepTheirPlans(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, err := Start(ctx, st, Config{Seed: 3}, engineConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	const n = 24
	rep, err := h.RunPhases(ctx, n, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Phases {
		if p.Nodes != n || p.Failed != 0 {
			t.Fatalf("%s: %d nodes, %d failed; want %d, none failed", p.Name, p.Nodes, p.Failed, n)
		}
	}
	// SQLite prepares a statement again now and then on its own: after a change of schema, and
	// here the two lookups of agents by node and by last contact, once or twice each, however
	// many machines; and a PRAGMA at each run (the writer's checkpoint before it restarts the
	// WAL, rare). Once a machine or more is a plan chosen by the value bound.
	for q, times := range st.RepreparedStatements() {
		if times > 2 && !strings.HasPrefix(q, "PRAGMA ") {
			t.Errorf("prepared again %d times as it ran: %.200s", times, q)
		}
	}
}
