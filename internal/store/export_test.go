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
