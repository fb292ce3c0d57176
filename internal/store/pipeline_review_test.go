package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// heldTable makes a table for the tests below and returns its insert (held) and its ids.
func heldTable(t *testing.T, st *store.Store, name string) (insert func(tx *store.Tx, id int) error, ids func() []int) {
	t.Helper()
	ctx := context.Background()
	if err := st.Write(ctx, func(tx *store.Tx) error {
		_, err := tx.ExecForTests(ctx, `CREATE TABLE `+name+` (id INTEGER PRIMARY KEY, v TEXT NOT NULL)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	insert = func(tx *store.Tx, id int) error {
		return tx.ExecLaterForTests(ctx, fmt.Sprintf("inserting row %d", id), `INSERT INTO `+name+` (id, v) VALUES (?, ?)`, id, "v")
	}
	ids = func() []int {
		t.Helper()
		var got []int
		if err := st.Write(ctx, func(tx *store.Tx) error {
			got = nil
			for id := range 40 {
				n, err := tx.QueryIntForTests(ctx, `SELECT COUNT(*) FROM `+name+` WHERE id = ?`, id)
				if err != nil {
					return err
				}
				if n == 1 {
					got = append(got, id)
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	return insert, ids
}

// A write made by a statement that returns rows (UPDATE … RETURNING, through Tx.query) inside
// a savepoint is the savepoint's like any other: f failing undoes it. The engine's
// reconciliation in a report's transaction (reconcileIn, a savepoint) withdraws the node's
// direct commands so (startWorkflow → WithdrawDirectCommands), after the report's command
// update was sent (UpdateCommandIf): only the savepoint is held when the withdrawal runs.
func TestSavepointUndoesWritesReturningRows(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		_, nodes := seed(t, st)
		n := nodes[0]
		var id string
		if err := st.Write(ctx, func(tx *store.Tx) error {
			c := store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: "bmc.power", Args: "{}", RunsOn: "site", State: "queued"}
			err := tx.InsertCommand(ctx, &c)
			id = c.ID
			return err
		}); err != nil {
			t.Fatal(err)
		}
		errNo := errors.New("no")
		if err := st.Write(ctx, func(tx *store.Tx) error {
			// As a report does before its reconciliation: the transaction's statements so far
			// are sent, nothing is held.
			if _, err := tx.Command(ctx, id); err != nil {
				return err
			}
			serr := tx.Savepoint(ctx, func() error {
				w, err := tx.WithdrawDirectCommands(ctx, n.ID, "withdrawn by the test")
				if err != nil {
					return err
				}
				if len(w) != 1 {
					t.Errorf("withdrew %v, want the one queued command", w)
				}
				return errNo // the reconciliation fails after the withdrawal
			})
			if !errors.Is(serr, errNo) {
				t.Errorf("savepoint: %v, want %v", serr, errNo)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		c, err := st.Command(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if c.State != "queued" {
			t.Errorf("command %s (%s) after the savepoint that withdrew it was rolled back, want queued", c.State, c.Error)
		}
	})
}

// A savepoint that says the transaction is unusable (a held write made before it failed as
// it went out with the savepoint's first statement) fails the whole write with that error,
// even when its caller goes on (the engine's wakeOrReconcile wakes the node instead): a
// serialization failure or deadlock there is retried as before the writes were held, not
// turned into "current transaction is aborted".
func TestSavepointFailureFailsTheWrite(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		if st.Engine() != store.Postgres {
			t.Skip("PostgreSQL's held writes")
		}
		ctx := context.Background()
		insert, ids := heldTable(t, st, "sp_fail_t")
		attempts := 0
		err := st.Write(ctx, func(tx *store.Tx) error {
			attempts++
			if err := insert(tx, 1); err != nil {
				return err
			}
			if attempts == 1 {
				// A held write that fails as a deadlock does (SQLSTATE 40P01).
				if err := tx.ExecLaterForTests(ctx, "updating a row",
					`DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01'; END $$`); err != nil {
					return err
				}
			}
			if err := tx.Savepoint(ctx, func() error {
				_, err := tx.QueryIntForTests(ctx, `SELECT COUNT(*) FROM sp_fail_t`)
				return err
			}); err != nil {
				t.Logf("attempt %d: savepoint: %v (the caller goes on)", attempts, err)
			}
			return insert(tx, 2)
		})
		if err != nil {
			t.Errorf("write: %v after %d attempts, want it retried and committed", err, attempts)
		}
		if attempts != 2 {
			t.Errorf("%d attempts, want 2", attempts)
		}
		if got := fmt.Sprint(ids()); err == nil && got != "[1 2]" {
			t.Errorf("rows %s, want [1 2]", got)
		}
	})
}

// A held write the driver cannot send (an argument pgx cannot encode: nothing of the pipeline
// reaches the database, which therefore aborts nothing) fails the write, whether or not its
// BEGIN had gone out, even when the caller goes on after the savepoint it surfaced in: the
// writes held with it are not dropped while the rest commits.
func TestHeldWriteNeverSent(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		insert, ids := heldTable(t, st, "unsent_t")
		for _, c := range []struct{ begun, inSavepoint bool }{{false, true}, {true, true}, {false, false}, {true, false}} {
			begun := c.begun
			err := st.Write(ctx, func(tx *store.Tx) error {
				if begun {
					if _, err := tx.QueryIntForTests(ctx, `SELECT COUNT(*) FROM unsent_t`); err != nil {
						return err
					}
				}
				if err := insert(tx, 1); err != nil {
					return err
				}
				// SQLite runs it now and fails here.
				if err := tx.ExecLaterForTests(ctx, "inserting a row the driver cannot send",
					`INSERT INTO unsent_t (id, v) VALUES (?, ?)`, 2, make(chan int)); err != nil {
					return err
				}
				// The read sends what is held, and fails; its caller goes on regardless.
				read := func() error {
					_, err := tx.QueryIntForTests(ctx, `SELECT COUNT(*) FROM unsent_t`)
					return err
				}
				if c.inSavepoint {
					_ = tx.Savepoint(ctx, read)
				} else {
					_ = read()
				}
				return insert(tx, 3)
			})
			if err == nil {
				t.Errorf("%+v: a write with a held statement never sent succeeded", c)
			}
			if got := ids(); len(got) != 0 {
				t.Errorf("%+v: rows %v committed, want none", c, got)
			}
		}
	})
}

// Savepoints nest: an outer savepoint's failure undoes its writes and those of the savepoints
// inside it that succeeded.
func TestNestedSavepoints(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		insert, ids := heldTable(t, st, "nested_t")
		errNo := errors.New("no")
		if err := st.Write(ctx, func(tx *store.Tx) error {
			if err := insert(tx, 1); err != nil {
				return err
			}
			serr := tx.Savepoint(ctx, func() error {
				if err := insert(tx, 2); err != nil {
					return err
				}
				if err := tx.Savepoint(ctx, func() error { return insert(tx, 3) }); err != nil {
					return err
				}
				return errNo
			})
			if !errors.Is(serr, errNo) {
				t.Errorf("outer savepoint: %v, want %v", serr, errNo)
			}
			return insert(tx, 4)
		}); err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(ids()); got != "[1 4]" {
			t.Errorf("rows %s, want [1 4]", got)
		}
	})
}

// A COMMIT the database answers with ROLLBACK (the transaction was aborted by a statement
// whose failure its caller let pass) fails the write, and the connection goes back to the
// pool usable rather than being discarded mid-pipeline.
func TestCommitAnsweredRollback(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		if st.Engine() != store.Postgres {
			t.Skip("PostgreSQL's COMMIT")
		}
		ctx := context.Background()
		_, ids := heldTable(t, st, "commit_rb_t")
		ids()
		open := st.OpenWriteConnsForTests()
		err := st.Write(ctx, func(tx *store.Tx) error {
			if _, err := tx.QueryIntForTests(ctx, `SELECT 1/0`); err == nil {
				t.Errorf("SELECT 1/0: no error")
			}
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), "rolled it back") {
			t.Fatalf("write: %v, want the commit's rollback", err)
		}
		if got := st.OpenWriteConnsForTests(); got != open {
			t.Errorf("%d connections open after the rolled-back commit, %d before: the connection was discarded", got, open)
		}
		ids()
	})
}
