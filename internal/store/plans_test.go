package store

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// The queries on the hot path of claims and departures, and those by node and workflow, must
// find their rows through the indexes made for them, not by scanning the commands table (which
// holds every command ever run) or the workflows table.
func TestCommandQueriesUseTheirIndexes(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	siteFrom, siteArgs, err := claimQuery("agent", "site", "site", "", 0, 1, []string{"bmc.media"})
	if err != nil {
		t.Fatal(err)
	}
	ramdiskFrom, ramdiskArgs, err := claimQuery("node:n", "node", "", "n", 1, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	site, siteIDs, ramdisk := `SELECT `+commandCols+` `+siteFrom, `SELECT id `+siteFrom, `SELECT `+commandCols+` `+ramdiskFrom
	cases := []struct {
		name, index, query string
		args               []any
		sorts              bool // sorts what it found (one node's rows), not the table
	}{
		{"site claim", "commands_claim_site", site, append(siteArgs, "agent", 8), false},
		{"site claim, ids", "commands_claim_site", siteIDs, append(siteArgs, "agent", 8), false},
		{"ramdisk claim", "commands_claim_ramdisk", ramdisk, append(ramdiskArgs, "node:n", 8), false},
		{"agent departure", "commands_agent_active", agentActiveQuery, []any{"agent"}, false},
		{"ramdisk departure", "commands_claim_ramdisk", nodeWaitingForRamdiskQuery, []any{"node:n"}, false},
		{"a node's commands", "commands_node", nodeCommandsQuery, []any{"n", 8}, true},
		{"a workflow's commands of a kind", "commands_node", workflowCommandsQuery(SQLite), []any{"n", "w", "disk.wipe"}, false},
		{"a node's direct commands", "commands_node", directCommandsQuery, []any{"n"}, false},
		{"ended workflows without unfinished commands", "commands_node", endedWorkflowsQuery, []any{1, 8}, false},
		{"purging ended workflows' commands", "commands_node", `DELETE FROM commands WHERE ` + ofWorkflows("(?, ?)") + ` AND ` + historyDeletableCommand, []any{"w", "v"}, false},
		{"loosening ended workflows' kept commands", "commands_node", `UPDATE commands SET workflow_id = '' WHERE ` + ofWorkflows("(?)"), []any{"w"}, false},
		{"a node's open workflow", "workflows_node_open", openWorkflowQuery, []any{"n", false}, false},
		{"a node's workflows", "workflows_node_open", nodeWorkflowsQuery, []any{"n", 8}, true},
		{"a node's open workflow's plan", "sqlite_autoindex_workflow_plans_1", openWorkflowQuery, []any{"n", false}, false},
		{"plans used before", "workflow_plans_used", purgePlansQuery, []any{1}, false},
		{"plans no workflow names", "workflows_plan", purgePlansQuery, []any{1}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rows, err := s.read.QueryContext(ctx, "EXPLAIN QUERY PLAN "+c.query, c.args...)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var plan []string
			for rows.Next() {
				var id, parent, unused int
				var detail string
				if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, detail)
			}
			got := strings.Join(plan, "; ")
			if !strings.Contains(got, " INDEX "+c.index+" ") || strings.Contains(got, "TEMP B-TREE") && !c.sorts { // USING [COVERING] INDEX
				t.Errorf("plan %q, want a search of %s in order", got, c.index)
			}
		})
	}
}

// The writer's commits reach the disk before their writes are answered: an agent runs a
// command only once its acknowledgement is committed, so a commit that a power loss could take
// back would let a second agent run it. The writer commits without waiting for the disk
// (synchronous NORMAL in WAL mode) and the WAL is flushed before the answer (flushLoop; the
// order is TestWriteIsAnsweredOnceItsCommitIsOnDisk's).
func TestWriterCommitsAreDurable(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	var journal string
	var synchronous int
	before := s.WriterStats().Flushes
	err := s.Write(ctx, func(tx *Tx) error {
		if err := tx.queryRow(ctx, "PRAGMA journal_mode").Scan(&journal); err != nil {
			return err
		}
		return tx.queryRow(ctx, "PRAGMA synchronous").Scan(&synchronous)
	})
	if err != nil {
		t.Fatal(err)
	}
	if journal != "wal" || synchronous != 1 {
		t.Fatalf("writer: journal_mode %q, synchronous %d; want wal and 1 (NORMAL: flushLoop flushes)", journal, synchronous)
	}
	if got := s.WriterStats().Flushes - before; got != 1 {
		t.Fatalf("%d flushes of the WAL before the write was answered, want 1", got)
	}
}

// A PostgreSQL store whose database has synchronous_commit off (here set by the DSN) commits
// durably all the same: its sessions set it on.
func TestPostgresCommitsAreDurable(t *testing.T) {
	base := os.Getenv("BCD_TEST_POSTGRES_DSN")
	if base == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("BCD_TEST_POSTGRES_DSN is not set under CI")
		}
		t.Skip("BCD_TEST_POSTGRES_DSN not set: PostgreSQL skipped outside CI")
	}
	ctx := context.Background()
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	schema := fmt.Sprintf("t_sync_%d", time.Now().UnixNano())
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	defer admin.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE")
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	for _, setting := range []string{"off", "local"} {
		s, err := Open(ctx, base+sep+"search_path="+schema+"&synchronous_commit="+setting)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = s.Write(ctx, func(tx *Tx) error { return tx.queryRow(ctx, "SHOW synchronous_commit").Scan(&got) })
		s.Close()
		want := map[string]string{"off": "on", "local": "local"}[setting]
		if err != nil || got != want {
			t.Errorf("database setting %s: the store's sessions run with %q (%v), want %q", setting, got, err, want)
		}
	}
}

// A command's every change of state or agent evaluates the conditions of the partial indexes
// over those columns, on the old row and the new: none of them may be coded as a temporary
// table (an IN list of more than two values is, built anew at each evaluation; migration 00045).
func TestCommandUpdatesBuildNoTemporaryTable(t *testing.T) {
	ctx := context.Background()
	s := openTempSQLite(t)
	for _, q := range []string{
		`UPDATE commands SET state = ?, target_agent = ?, updated_at = ? WHERE id = ?`,
		`UPDATE commands SET state = 'delivered', delivered_at = ?, updated_at = ? WHERE id = ?`,
		`UPDATE commands SET target_agent = ?, cancel_requested_at = ? WHERE id = ?`,
		`UPDATE workflows SET outcome_applied = ?, finished_at = ? WHERE id = ?`,
		`UPDATE nodes SET state = ?, batch_id = ? WHERE id = ?`,
	} {
		rows, err := s.read.QueryContext(ctx, "EXPLAIN "+q, make([]any, strings.Count(q, "?"))...)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			for i := range vals {
				vals[i] = new(any)
			}
			if err := rows.Scan(vals...); err != nil {
				t.Fatal(err)
			}
			if op := fmt.Sprint(*vals[1].(*any)); op == "OpenEphemeral" {
				t.Errorf("%.60q builds a temporary table (a partial index's condition with an IN list?)", q)
			}
		}
		rows.Close()
	}
}
