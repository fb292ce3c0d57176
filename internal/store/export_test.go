package store

import (
	"context"
	"fmt"
)

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

// heldForTests inserts the events SQLite's writer holds (holdEvents), so that a statement of a
// test sees them.
func (t *Tx) heldForTests(ctx context.Context) error {
	if t.lc == nil {
		return nil
	}
	return t.insertHeldEvents(ctx)
}

// ExecForTests runs a write now (with what is held before it) and returns its rows affected.
func (t *Tx) ExecForTests(ctx context.Context, q string, args ...any) (int64, error) {
	if err := t.heldForTests(ctx); err != nil {
		return 0, err
	}
	res, err := t.exec(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// QueryIntForTests reads one integer.
func (t *Tx) QueryIntForTests(ctx context.Context, q string, args ...any) (int64, error) {
	if err := t.heldForTests(ctx); err != nil {
		return 0, err
	}
	var n int64
	err := t.queryRow(ctx, q, args...).Scan(&n)
	return n, err
}

// TripsForTests counts the transaction's round trips to the database so far (PostgreSQL).
func (t *Tx) TripsForTests() int { return t.trips }

// QueryPairsForTests reads rows of an integer and a string through the transaction's read of
// several rows (Tx.query).
func (t *Tx) QueryPairsForTests(ctx context.Context, q string, args ...any) ([]string, error) {
	if err := t.heldForTests(ctx); err != nil {
		return nil, err
	}
	rows, err := t.query(ctx, q, args...)
	return collect(rows, err, "pairs", func(r interface{ Scan(...any) error }) (string, error) {
		var id int64
		var v string
		err := r.Scan(&id, &v)
		return fmt.Sprintf("%d=%s", id, v), err
	})
}

// HeldForTests says how many statements the transaction holds unsent (PostgreSQL).
func (t *Tx) HeldForTests() int { return len(t.later) }

// OpenWriteConnsForTests is the number of connections the writer's pool holds open.
func (s *Store) OpenWriteConnsForTests() int { return s.write.Stats().OpenConnections }

// SetEventScanWindowForTests makes event listings by kind read n ids (events, following on
// PostgreSQL) a statement.
func (s *Store) SetEventScanWindowForTests(n int) { s.eventWindow = n }
