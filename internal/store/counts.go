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
