package store

import "context"

// JoinTokenExpiryForTests reads a join token's expiry by its hash.
func (t *Tx) JoinTokenExpiryForTests(ctx context.Context, hash []byte) (int64, error) {
	var at int64
	err := t.queryRow(ctx, `SELECT expires_at FROM join_tokens WHERE hash = ?`, hash).Scan(&at)
	return at, err
}

// SetJoinTokenUsedForTests marks a join token used at the given time.
func (t *Tx) SetJoinTokenUsedForTests(ctx context.Context, hash []byte, at int64) error {
	_, err := t.exec(ctx, `UPDATE join_tokens SET used_at = ? WHERE hash = ?`, at, hash)
	return err
}

// ExecLaterForTests holds a write as the store's own writes whose outcome nothing reads
// (execLater).
func (t *Tx) ExecLaterForTests(ctx context.Context, what, q string, args ...any) error {
	return t.execLater(ctx, what, q, args...)
}

// ExecForTests runs a write now (with what is held before it) and returns its rows affected.
func (t *Tx) ExecForTests(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := t.exec(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// QueryIntForTests reads one integer.
func (t *Tx) QueryIntForTests(ctx context.Context, q string, args ...any) (int64, error) {
	var n int64
	err := t.queryRow(ctx, q, args...).Scan(&n)
	return n, err
}

// HeldForTests says how many statements the transaction holds unsent (PostgreSQL).
func (t *Tx) HeldForTests() int { return len(t.later) }

// OpenWriteConnsForTests is the number of connections the writer's pool holds open.
func (s *Store) OpenWriteConnsForTests() int { return s.write.Stats().OpenConnections }
