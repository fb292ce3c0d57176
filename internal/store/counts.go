package store

import (
	"context"
	"fmt"
	"time"
)

// CountInMaintenance counts the nodes in maintenance: of one tenant, or of every tenant when
// tenantID is "" (the web UI's dashboard).
func (s *Store) CountInMaintenance(ctx context.Context, tenantID string) (int, error) {
	q, args := `SELECT COUNT(*) FROM nodes WHERE maintenance = ?`, []any{true}
	if tenantID != "" {
		q, args = q+` AND tenant_id = ?`, append(args, tenantID)
	}
	var n int
	if err := s.queryRow(ctx, q, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the nodes in maintenance: %w", err)
	}
	return n, nil
}

// strandedWhere selects the stranded nodes (doctor): a workflow-driven target, not failed, not
// in maintenance, with neither a wake-up row nor an open workflow. Its arguments: false, false.
const strandedWhere = `target_state <> '' AND state <> 'failed' AND maintenance = ?
		AND id NOT IN (SELECT node_id FROM reconcile_queue)
		AND id NOT IN (SELECT node_id FROM workflows WHERE outcome_applied = ?)`

// CountStranded counts the stranded nodes (StrandedNodes): of one tenant, or of every tenant
// when tenantID is "" (the web UI's dashboard).
func (s *Store) CountStranded(ctx context.Context, tenantID string) (int, error) {
	q, args := `SELECT COUNT(*) FROM nodes WHERE `+strandedWhere, []any{false, false}
	if tenantID != "" {
		q, args = q+` AND tenant_id = ?`, append(args, tenantID)
	}
	var n int
	if err := s.queryRow(ctx, q, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("counting the stranded nodes: %w", err)
	}
	return n, nil
}

// CommandWaits lists how long the commands queued at or after since (micros, as created_at)
// waited for an agent: from queued to the agent's acknowledgement (delivered_at), by where
// they run (site, ramdisk). Commands no agent acknowledged are left out. It reads every
// such row: a measurement's read (bcd sim, after a phase), not a page's.
func (s *Store) CommandWaits(ctx context.Context, since int64) (map[string][]time.Duration, error) {
	rows, err := s.queryRows(ctx, `SELECT runs_on, delivered_at - created_at FROM commands WHERE created_at >= ? AND delivered_at > 0`, since)
	if err != nil {
		return nil, fmt.Errorf("reading the commands' waits for an agent: %w", err)
	}
	defer rows.Close()
	out := map[string][]time.Duration{}
	for rows.Next() {
		var on string
		var waited int64
		if err := rows.Scan(&on, &waited); err != nil {
			return nil, fmt.Errorf("reading a command's wait for an agent: %w", err)
		}
		out[on] = append(out[on], time.Duration(max(waited, 0))*time.Microsecond)
	}
	return out, rows.Err()
}

// QueueDepth is the commands of a site waiting for an agent to take them, of those that run on
// one kind of agent (RunsOn: site, its site agents; ramdisk, the nodes' ramdisks): how many, and
// when the oldest was queued (micros).
type QueueDepth struct {
	SiteID, RunsOn string
	Commands       int
	Oldest         int64
}

// QueueDepths counts the commands waiting for an agent (queued, not yet acknowledged), by site
// and by the agents they run on, sites in id order, site agents' first: doctor. Each count
// reads its kind's claim index (commands_claim_site, commands_claim_ramdisk), whose condition
// the query names in its text so that the planner may take it.
func (s *Store) QueueDepths(ctx context.Context) ([]QueueDepth, error) {
	var out []QueueDepth
	for _, on := range []string{"site", "ramdisk"} {
		rows, err := s.queryRows(ctx, queueDepthQuery(on))
		if err != nil {
			return nil, fmt.Errorf("counting the commands waiting for %s agents: %w", on, err)
		}
		for rows.Next() {
			d := QueueDepth{RunsOn: on}
			if err := rows.Scan(&d.SiteID, &d.Commands, &d.Oldest); err != nil {
				rows.Close()
				return nil, fmt.Errorf("reading the commands waiting for %s agents: %w", on, err)
			}
			out = append(out, d)
		}
		if err := rows.Close(); err != nil {
			return nil, err
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("counting the commands waiting for %s agents: %w", on, err)
		}
	}
	return out, nil
}

// queueDepthQuery counts the queued commands of each site that run on agents of kind on, a
// constant ("site", "ramdisk"): written into the query, as the claim indexes' conditions are.
func queueDepthQuery(on string) string {
	return `SELECT site_id, COUNT(*), MIN(created_at) FROM commands WHERE state = 'queued' AND runs_on = '` + on + `'
		GROUP BY site_id ORDER BY site_id`
}
