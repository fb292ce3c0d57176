package store

import (
	"context"
	"fmt"
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
