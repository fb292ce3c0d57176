package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestHeldWrites: on PostgreSQL the writes whose outcome nothing reads are held and sent with
// the next statement (the transaction's BEGIN and COMMIT among them); on SQLite they run at
// once. Either way a transaction reads its own writes, a held write's failure is the failure
// of the savepoint it was written in (or of the whole write), nothing half-written is
// committed, and no connection goes back to the pool inside a transaction.
func TestHeldWrites(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		pg := st.Engine() == store.Postgres
		insert, ids := heldTable(t, st, "held_t")
		have := func(want ...int) {
			t.Helper()
			if got := ids(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("rows %v, want %v", got, want)
			}
		}
		errNo := errors.New("no")

		// Held until read; a read sees them; an exec after them answers for itself.
		if err := st.Write(ctx, func(tx *store.Tx) error {
			if err := insert(tx, 1); err != nil {
				return err
			}
			if err := insert(tx, 2); err != nil {
				return err
			}
			if held := tx.HeldForTests(); pg && held < 2 || !pg && held != 0 {
				t.Errorf("held %d statements after two writes (postgres %v)", held, pg)
			}
			n, err := tx.QueryIntForTests(ctx, `SELECT COUNT(*) FROM held_t`)
			if err != nil || n != 2 {
				t.Errorf("a read after two held writes: %d, %v", n, err)
			}
			if err := insert(tx, 3); err != nil {
				return err
			}
			// A read finding nothing says so as database/sql does, held writes before it or not.
			if _, err := tx.QueryIntForTests(ctx, `SELECT id FROM held_t WHERE id = 99`); !errors.Is(err, sql.ErrNoRows) {
				t.Errorf("a read of no row after a held write: %v, want sql.ErrNoRows", err)
			}
			if n, err := tx.QueryIntForTests(ctx, `SELECT id FROM held_t WHERE id = 3`); err != nil || n != 3 {
				t.Errorf("a read of the row just written: %d, %v", n, err)
			}
			if _, err := tx.ExecForTests(ctx, `DELETE FROM held_t WHERE id = 3`); err != nil {
				return err
			}
			if err := insert(tx, 3); err != nil {
				return err
			}
			rows, err := tx.ExecForTests(ctx, `UPDATE held_t SET v = 'w' WHERE id IN (1, 3)`)
			if err != nil || rows != 2 {
				t.Errorf("exec after a held write: %d rows, %v; want 2", rows, err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		have(1, 2, 3)

		for _, c := range []struct {
			name string
			f    func(tx *store.Tx) error // inside the savepoint
			want string                   // the savepoint's error
		}{
			{"held write fails at the savepoint's end", func(tx *store.Tx) error {
				if err := insert(tx, 5); err != nil {
					return err
				}
				return insert(tx, 1) // taken: fails when sent
			}, "inserting row 1"},
			{"fails before anything was sent", func(tx *store.Tx) error {
				if err := insert(tx, 5); err != nil {
					return err
				}
				return errNo
			}, "no"},
			{"fails after its writes were sent", func(tx *store.Tx) error {
				if err := insert(tx, 5); err != nil {
					return err
				}
				if _, err := tx.QueryIntForTests(ctx, `SELECT COUNT(*) FROM held_t`); err != nil {
					return err
				}
				return errNo
			}, "no"},
			{"nothing to do", func(tx *store.Tx) error { return nil }, ""},
		} {
			t.Run(c.name, func(t *testing.T) {
				var run runChecks
				err := st.Write(ctx, func(tx *store.Tx) error {
					run.start()
					if err := insert(tx, 4); err != nil {
						return err
					}
					err := tx.Savepoint(ctx, func() error { return c.f(tx) })
					if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
						run.Errorf("savepoint: %v, want %q", err, c.want)
					}
					// The transaction goes on: the savepoint's writes alone are undone.
					if err := insert(tx, 6); err != nil {
						return err
					}
					return tx.ExecLaterForTests(ctx, "cleaning", `DELETE FROM held_t WHERE id IN (4, 6)`)
				})
				if err != nil {
					t.Fatal(err)
				}
				run.report(t)
				have(1, 2, 3)
			})
		}

		// A held write failing at the commit fails the write, and nothing of it is kept; the
		// pool's connections are not left inside the failed transaction (more writes than
		// connections follow).
		err := st.Write(ctx, func(tx *store.Tx) error {
			if err := insert(tx, 7); err != nil {
				return err
			}
			return insert(tx, 2)
		})
		if err == nil || !strings.Contains(err.Error(), "inserting row 2") {
			t.Fatalf("a held write failing at the commit: %v", err)
		}
		for i := range 40 {
			id := 8 + i%2
			if err := st.Write(ctx, func(tx *store.Tx) error {
				if i%2 == 1 {
					return insert(tx, 2) // fails, with what is held
				}
				if err := insert(tx, id); err != nil {
					return err
				}
				return tx.ExecLaterForTests(ctx, "deleting", `DELETE FROM held_t WHERE id = ?`, id)
			}); (err != nil) != (i%2 == 1) {
				t.Fatalf("write %d: %v", i, err)
			}
		}
		have(1, 2, 3)

		// A read failing inside a savepoint before anything of it was sent: on SQLite the
		// savepoint alone fails; on PostgreSQL the database aborted the whole transaction.
		err = st.Write(ctx, func(tx *store.Tx) error {
			if err := insert(tx, 10); err != nil {
				return err
			}
			if _, err := tx.QueryIntForTests(ctx, `SELECT COUNT(*) FROM held_t`); err != nil {
				return err
			}
			serr := tx.Savepoint(ctx, func() error {
				_, err := tx.QueryIntForTests(ctx, `SELECT COUNT(*) FROM no_such_table`)
				return err
			})
			if serr == nil {
				t.Errorf("a failed read in a savepoint: no error")
			}
			return nil
		})
		if pg && err == nil {
			t.Errorf("postgres: the transaction went on after a failed read aborted it")
		}
		if !pg && err != nil {
			t.Errorf("sqlite: %v", err)
		}
		if pg {
			have(1, 2, 3)
		} else {
			have(1, 2, 3, 10)
		}
	})
}

// runChecks keeps what a write's function found wrong in its last run alone: a write may run
// more than once (PostgreSQL runs it again with savepoints when a savepoint run without one
// failed; see Store.Write), and what counts is the run that committed.
type runChecks struct{ errs []string }

// start begins a run: what earlier runs found is dropped.
func (c *runChecks) start() { c.errs = nil }

func (c *runChecks) Errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// report fails t with what the last run found.
func (c *runChecks) report(t *testing.T) {
	t.Helper()
	for _, e := range c.errs {
		t.Error(e)
	}
}
