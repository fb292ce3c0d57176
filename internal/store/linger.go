package store

import (
	"context"
	"fmt"
)

// WithdrawCommand fails a command no agent acknowledged yet (queued) with why. closed says it
// did; offered says an agent had claimed it (it may hold it, but it is never offered again, to
// it or to a later agent of the same id). A command acknowledged or finished meanwhile is left
// alone. Each decision is one conditional update under the row's lock, so a concurrent claim or
// acknowledgement and the withdrawal never both win.
func (t *Tx) WithdrawCommand(ctx context.Context, id, why string) (closed, offered bool, err error) {
	for _, q := range []string{
		`UPDATE commands SET state = 'failed', error = ?, finished_at = ?, updated_at = ? WHERE id = ? AND state = 'queued' AND target_agent = ''`,
		`UPDATE commands SET state = 'failed', error = ?, finished_at = ?, updated_at = ? WHERE id = ? AND state = 'queued'`,
	} {
		res, err := t.exec(ctx, q, why, t.at, t.at, id)
		if err != nil {
			return false, false, fmt.Errorf("withdrawing command %s: %w", id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return false, false, fmt.Errorf("withdrawing command %s: %w", id, err)
		}
		if n == 1 {
			return true, offered, nil
		}
		offered = true
	}
	return false, false, nil
}

// AgentConnected reports whether agent id has a connection now.
func (t *Tx) AgentConnected(ctx context.Context, id string) (bool, error) {
	var n int
	if err := t.queryRow(ctx, `SELECT COUNT(*) FROM agents WHERE id = ? AND connected = ?`, id, true).Scan(&n); err != nil {
		return false, fmt.Errorf("reading agent %s: %w", id, err)
	}
	return n > 0, nil
}
