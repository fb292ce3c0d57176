package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// SQLite's writer runs a group's writes without savepoints and, when one of them fails (its
// function, or a savepoint inside it), rolls the pass back and runs the group again with a
// savepoint for the write that failed and each after it: every caller gets its own outcome,
// the failed writes are undone alone, and a group in which nothing fails is run once.
func TestGroupRunsWithoutSavepointsUntilAWriteFails(t *testing.T) {
	ctx := context.Background()
	refused := errors.New("refused")
	type write struct {
		ids  []int // rows it inserts
		fail string
		// fail: "" succeeds; "outer" returns refused after its inserts; "nested" inserts ids[1:]
		// in a savepoint that fails and is swallowed (f returns nil); "second" succeeds the first
		// time it runs and fails every time after; "cancelled" has a cancelled context.
	}
	cases := []struct {
		name   string
		writes []write
		want   []string // each caller's outcome
		rows   []int    // rows committed
		runs   []int    // how many times each function ran
		reruns int64    // passes run again
	}{
		{
			name:   "nothing fails: one pass",
			writes: []write{{ids: []int{1}}, {ids: []int{2, 3}}, {ids: []int{4}}},
			want:   []string{"<nil>", "<nil>", "<nil>"},
			rows:   []int{1, 2, 3, 4},
			runs:   []int{1, 1, 1},
		},
		{
			name:   "a write fails: run again from it with savepoints",
			writes: []write{{ids: []int{1}}, {ids: []int{2}}, {ids: []int{3, 4}, fail: "outer"}, {ids: []int{5}}},
			want:   []string{"<nil>", "<nil>", "refused", "<nil>"},
			rows:   []int{1, 2, 5},
			runs:   []int{2, 2, 2, 1},
			reruns: 1,
		},
		{
			name:   "the first write fails",
			writes: []write{{ids: []int{1}, fail: "outer"}, {ids: []int{2}}},
			want:   []string{"refused", "<nil>"},
			rows:   []int{2},
			runs:   []int{2, 1},
			reruns: 1,
		},
		{
			name:   "a savepoint inside a write fails and the write goes on",
			writes: []write{{ids: []int{1}}, {ids: []int{2, 3, 4}, fail: "nested"}, {ids: []int{5}}},
			want:   []string{"<nil>", "<nil>", "<nil>"},
			rows:   []int{1, 2, 5},
			runs:   []int{2, 2, 1},
			reruns: 1,
		},
		{
			name: "two writes fail: one more pass",
			writes: []write{{ids: []int{1}}, {ids: []int{2}, fail: "outer"}, {ids: []int{3}},
				{ids: []int{4, 5}, fail: "nested"}, {ids: []int{6}, fail: "outer"}},
			want:   []string{"<nil>", "refused", "<nil>", "<nil>", "refused"},
			rows:   []int{1, 3, 4},
			runs:   []int{2, 2, 1, 1, 1},
			reruns: 1,
		},
		{
			name:   "a write that succeeded fails when run again",
			writes: []write{{ids: []int{1}}, {ids: []int{2}, fail: "second"}, {ids: []int{3}, fail: "outer"}, {ids: []int{4}}},
			want:   []string{"<nil>", "refused", "refused", "<nil>"},
			rows:   []int{1, 4},
			runs:   []int{3, 3, 2, 1},
			reruns: 2,
		},
		{
			name:   "a caller gone before its write ran",
			writes: []write{{ids: []int{1}}, {ids: []int{2}, fail: "cancelled"}, {ids: []int{3}, fail: "outer"}},
			want:   []string{"<nil>", "context canceled", "refused"},
			rows:   []int{1},
			runs:   []int{2, 0, 2},
			reruns: 1,
		},
	}
	s := openTempSQLite(t)
	if err := s.Write(ctx, func(tx *Tx) error {
		_, err := tx.exec(ctx, `CREATE TABLE optimistic (id INTEGER PRIMARY KEY)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := s.write.ExecContext(ctx, `DELETE FROM optimistic`); err != nil {
				t.Fatal(err)
			}
			runs := make([]int, len(c.writes))
			insert := func(tx *Tx, ids []int) error {
				for _, id := range ids {
					if _, err := tx.exec(ctx, `INSERT INTO optimistic (id) VALUES (?)`, id); err != nil {
						return err
					}
				}
				return nil
			}
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			group := make([]*writeReq, len(c.writes))
			for i, w := range c.writes {
				f := func(tx *Tx) error {
					runs[i]++
					switch w.fail {
					case "outer":
						return errors.Join(insert(tx, w.ids), refused)
					case "second":
						if runs[i] > 1 {
							return errors.Join(insert(tx, w.ids), refused)
						}
					case "nested":
						if err := insert(tx, w.ids[:1]); err != nil {
							return err
						}
						if err := tx.Savepoint(ctx, func() error { return errors.Join(insert(tx, w.ids[1:]), refused) }); !errors.Is(err, refused) {
							return fmt.Errorf("the savepoint returned %v, want its function's error", err)
						}
						return nil
					}
					return insert(tx, w.ids)
				}
				wctx := ctx
				if w.fail == "cancelled" {
					wctx = cancelled
				}
				group[i] = &writeReq{ctx: wctx, f: f, done: make(chan error, 1)}
			}
			before := s.WriterStats().Reruns
			s.commitGroup(group)
			for i, want := range c.want {
				if got := fmt.Sprint(<-group[i].done); got != want {
					t.Errorf("write %d: %s, want %s", i, got, want)
				}
			}
			rows, err := s.queryRows(ctx, `SELECT id FROM optimistic ORDER BY id`)
			got, err := collect(rows, err, "ids", func(r interface{ Scan(...any) error }) (int, error) {
				var id int
				return id, r.Scan(&id)
			})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, c.rows) {
				t.Errorf("rows %v, want %v", got, c.rows)
			}
			if !slices.Equal(runs, c.runs) {
				t.Errorf("functions ran %v times, want %v", runs, c.runs)
			}
			if got := s.WriterStats().Reruns - before; got != c.reruns {
				t.Errorf("passes run again: %d, want %d", got, c.reruns)
			}
		})
	}
}
