package store

import (
	"context"
	"database/sql"
)

// updateByRow runs an update of one row found by its id: q, whose arguments are args and then
// key (the id first, then the rest of its condition's); or, where SQLite's writer cache holds
// the row (row > 0, its rowid), qRow, the same statement whose condition takes the rowid before
// the id. SQLite finds the row through the table's own b-tree alone, not first through the index
// of its id (a descent of three levels at 10 000 nodes): a node's, a workflow's or a command's
// update is a few microseconds cheaper. The id is still checked. Should qRow change no row (the
// rest of its condition failed, as a stale version does; or the row at rowid is not the id's,
// which the cache's invariant rules out), q runs after it, so what the caller gets is q's
// result either way.
func (t *Tx) updateByRow(ctx context.Context, q, qRow string, row int64, args []any, key ...any) (sql.Result, error) {
	// One slice for both statements' arguments (the second's are a suffix of the first's).
	all := make([]any, 0, len(args)+1+len(key))
	all = append(all, args...)
	if row > 0 && t.lc != nil {
		res, err := t.exec(ctx, qRow, append(append(all, row), key...)...)
		if err != nil {
			return nil, err
		}
		if c, _ := res.RowsAffected(); c > 0 {
			return res, nil
		}
	}
	return t.exec(ctx, q, append(all, key...)...)
}
