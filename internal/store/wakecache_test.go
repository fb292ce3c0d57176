package store

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"
)

// SQLite's writer leaves out SetWakeUp's statement when it would keep the node's wake-up row as
// it is: known to the writer's cache (no statement at all), or read first (one). Whatever changed
// the row in between (another statement, a lease, a removal, a rolled-back write), the row after
// each step is the one the statement would have left, and the cache was not trusted for it.
func TestWriterSetsOnlyWakeUpsItWouldChange(t *testing.T) {
	ctx := context.Background()
	s, node := openWithNode(t)
	type row struct {
		due      int64
		failures int
		leased   bool
		exists   bool
	}
	read := func() row {
		t.Helper()
		var r row
		err := s.queryRow(ctx, `SELECT due_at, failures, leased_by <> '' FROM reconcile_queue WHERE node_id = ?`, node.ID).Scan(&r.due, &r.failures, &r.leased)
		if err == nil {
			r.exists = true
		} else if !errors.Is(err, sql.ErrNoRows) {
			t.Fatal(err)
		}
		return r
	}
	// set runs prepare (if any) and then SetWakeUp(again) in one write; it returns the write's
	// time and the statements SetWakeUp ran.
	set := func(again time.Duration, prepare func(tx *Tx) error) (at int64, ran int64) {
		t.Helper()
		var before int64
		if err := s.Write(ctx, func(tx *Tx) error {
			at = tx.At()
			if prepare != nil {
				if err := prepare(tx); err != nil {
					return err
				}
			}
			before = s.WriterStats().Statements
			err := tx.SetWakeUp(ctx, node.ID, "deadline", again, -1)
			ran = s.WriterStats().Statements - before
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return at, ran
	}
	exec := func(q string) func(tx *Tx) error {
		return func(tx *Tx) error { _, err := tx.exec(ctx, q, node.ID); return err }
	}
	us := func(d time.Duration) int64 { return d.Microseconds() }

	at, ran := set(time.Hour, nil)
	first := at + us(time.Hour)
	if got := read(); got != (row{due: first, exists: true}) || ran != 2 {
		t.Fatalf("first wake-up: row %+v after %d statements, want due at %d after 2 (a read, an insert)", got, ran, first)
	}
	var first2 int64 // (what the earlier one set: the steps after it keep it)
	steps := []struct {
		name    string
		again   time.Duration
		prepare func(tx *Tx) error
		ran     int64
		want    func(at int64) row
	}{
		{"a later one is kept, without the statement", 2 * time.Hour, nil, 0,
			func(int64) row { return row{due: first, exists: true} }},
		{"the same again is kept, without the statement", time.Hour, nil, 0,
			func(int64) row { return row{due: first, exists: true} }},
		{"an earlier one replaces it (the row known: no read)", time.Minute, nil, 1,
			func(at int64) row { first2 = at + us(time.Minute); return row{due: first2, exists: true} }},
		{"a row another statement touched is read, and kept", 2 * time.Hour,
			exec(`UPDATE reconcile_queue SET reason = 'touched' WHERE node_id = ?`), 1,
			func(int64) row { return row{due: first2, exists: true} }},
		{"and then known", 2 * time.Hour, nil, 0,
			func(int64) row { return row{due: first2, exists: true} }},
		{"a row another statement changed is not trusted", 3 * time.Hour,
			exec(`UPDATE reconcile_queue SET failures = 3, failing_since = 1, last_error = 'boom' WHERE node_id = ?`), 2,
			func(at int64) row { return row{due: at + us(3*time.Hour), exists: true} }},
		{"a row already due is replaced", 4 * time.Hour,
			exec(`UPDATE reconcile_queue SET due_at = 1 WHERE node_id = ?`), 2,
			func(at int64) row { return row{due: at + us(4*time.Hour), exists: true} }},
		{"a leased row is left to its holder (read only)", time.Second,
			exec(`UPDATE reconcile_queue SET leased_by = 'worker', leased_until = 1 WHERE node_id = ?`), 1,
			func(at int64) row { return row{due: 0, exists: true, leased: true} }},
		{"a released row is set again", 5 * time.Hour,
			exec(`UPDATE reconcile_queue SET leased_by = '', leased_until = 0, due_at = 1 WHERE node_id = ?`), 2,
			func(at int64) row { return row{due: at + us(5*time.Hour), exists: true} }},
		{"a deleted row is inserted again", 6 * time.Hour,
			exec(`DELETE FROM reconcile_queue WHERE node_id = ?`), 2,
			func(at int64) row { return row{due: at + us(6*time.Hour), exists: true} }},
		{"a row SetWakeUp removed is inserted again", 7 * time.Hour,
			func(tx *Tx) error { return tx.SetWakeUp(ctx, node.ID, "", 0, -1) }, 2,
			func(at int64) row { return row{due: at + us(7*time.Hour), exists: true} }},
	}
	for _, st := range steps {
		at, ran := set(st.again, st.prepare)
		want := st.want(at)
		got := read()
		if want.leased {
			want.due = got.due // (the holder's: whatever it was)
		}
		if got != want || ran != st.ran {
			t.Errorf("%s: row %+v after %d statements, want %+v after %d", st.name, got, ran, want, st.ran)
		}
	}

	// A write that set the wake-up and was then rolled back leaves no row, and the next sets it.
	if err := s.Write(ctx, func(tx *Tx) error { return tx.SetWakeUp(ctx, node.ID, "", 0, -1) }); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := s.Write(ctx, func(tx *Tx) error {
		if err := tx.SetWakeUp(ctx, node.ID, "deadline", time.Hour, -1); err != nil {
			return err
		}
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("the rolled-back write returned %v", err)
	}
	if got := read(); got.exists {
		t.Fatalf("a rolled-back wake-up is stored: %+v", got)
	}
	at, ran = set(time.Hour, nil)
	if got, want := read(), (row{due: at + us(time.Hour), exists: true}); got != want || ran != 2 {
		t.Errorf("after a rollback: row %+v after %d statements, want %+v after 2", got, ran, want)
	}
}
