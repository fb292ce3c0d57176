package store

import (
	"context"
	"fmt"
)

// WithdrawCommand fails a command no agent was offered yet (queued, unassigned) with why, and
// reports whether it did: a command an agent claimed meanwhile is left alone (the decision is
// the row's, under its lock, so a concurrent claim and a withdrawal never both win).
func (t *Tx) WithdrawCommand(ctx context.Context, id, why string) (bool, error) {
	res, err := t.exec(ctx, `UPDATE commands SET state = 'failed', error = ?, finished_at = ?, updated_at = ?
		WHERE id = ? AND state = 'queued' AND target_agent = ''`, why, t.at, t.at, id)
	if err != nil {
		return false, fmt.Errorf("withdrawing command %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("withdrawing command %s: %w", id, err)
	}
	return n == 1, nil
}
