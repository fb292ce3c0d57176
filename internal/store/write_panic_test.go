package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// A write whose function panics is undone and the panic goes on in the caller's goroutine, on
// either engine; the store goes on serving writes. On SQLite, where one writer runs every
// caller's function, the other writes committed with it in one group are not affected.
func TestWritePanicStaysWithItsCaller(t *testing.T) {
	ctx := context.Background()
	for engine, s := range openEachEngine(t) {
		t.Run(string(engine), func(t *testing.T) {
			if err := s.Write(ctx, func(tx *Tx) error {
				_, err := tx.exec(ctx, `CREATE TABLE panics (id INTEGER PRIMARY KEY)`)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			insert := func(id int) func(tx *Tx) error {
				return func(tx *Tx) error {
					_, err := tx.exec(ctx, `INSERT INTO panics (id) VALUES (?)`, id)
					return err
				}
			}
			ids := func() []int {
				t.Helper()
				rows, err := s.queryRows(ctx, `SELECT id FROM panics ORDER BY id`)
				got, err := collect(rows, err, "ids", func(r interface{ Scan(...any) error }) (int, error) {
					var id int
					return id, r.Scan(&id)
				})
				if err != nil {
					t.Fatal(err)
				}
				return got
			}
			boom := errors.New("boom")
			panicking := func(tx *Tx) error {
				if err := insert(100)(tx); err != nil {
					return err
				}
				panic(boom)
			}
			caught := func() (v any) {
				defer func() { v = recover() }()
				err := s.Write(ctx, panicking)
				t.Errorf("Write returned %v, want the panic", err)
				return nil
			}()
			if caught != boom {
				t.Fatalf("recovered %v, want the function's panic", caught)
			}
			if err := s.Write(ctx, insert(1)); err != nil {
				t.Fatalf("a write after the panic: %v", err)
			}
			if got := ids(); !slices.Equal(got, []int{1}) {
				t.Fatalf("rows %v, want [1]: the panicking write undone, the next one kept", got)
			}
			if engine != SQLite {
				return
			}
			// One group: writes before and after the panicking one commit.
			cases := []struct {
				f    func(*Tx) error
				want string // the request's outcome
			}{
				{insert(2), "<nil>"},
				{panicking, "the write panicked: boom"},
				{insert(3), "<nil>"},
				{func(tx *Tx) error { return errors.Join(insert(4)(tx), errors.New("refused")) }, "refused"},
				{insert(5), "<nil>"},
				// A panic inside a nested savepoint, left open by it.
				{func(tx *Tx) error {
					if err := insert(6)(tx); err != nil {
						return err
					}
					return tx.Savepoint(ctx, func() error {
						if err := insert(7)(tx); err != nil {
							return err
						}
						panic(boom)
					})
				}, "the write panicked: boom"},
				{insert(8), "<nil>"},
			}
			group := make([]*writeReq, len(cases))
			for i, c := range cases {
				group[i] = &writeReq{ctx: ctx, f: c.f, done: make(chan error, 1)}
			}
			s.commitGroup(group)
			for i, c := range cases {
				if got := fmt.Sprint(<-group[i].done); got != c.want {
					t.Errorf("write %d of the group: %s, want %s", i, got, c.want)
				}
			}
			if got := ids(); !slices.Equal(got, []int{1, 2, 3, 5, 8}) {
				t.Errorf("rows %v, want [1 2 3 5 8]", got)
			}
		})
	}
}
