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

// A write runs first without savepoints, on PostgreSQL as in SQLite's writer: a savepoint that
// succeeds costs no round trip (its writes go out with the commit), and one that fails is
// undone all the same: by dropping what it held while nothing of it reached the database, else
// by running the write again with savepoints (counted in WriterStats.Reruns). What a caller
// sees is the same as with savepoints: the savepoint's error, and its writes alone undone.
func TestWritesRunWithoutSavepointsFirst(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		pg := st.Engine() == store.Postgres
		errNo := errors.New("no")
		for i, c := range []struct {
			name string
			// f runs inside the savepoint; insert holds a row's insert, read reads the table.
			f          func(insert func(int) error, read func() error) error
			want       string // the savepoint's error in the run that counted ("": none)
			runsPG     int    // runs of the write's function on PostgreSQL
			runsSQLite int    // and in SQLite's writer
			tripsPG    int64  // round trips on PostgreSQL (0: not checked)
			stmtsPG    int64  // statements sent on PostgreSQL (0: not checked)
		}{
			{"succeeds", func(insert func(int) error, _ func() error) error {
				return insert(2)
			}, "", 1, 1, 1, 5}, // BEGIN, rows 1, 2 and 3, COMMIT: no SAVEPOINT
			{"fails before anything of it was sent", func(insert func(int) error, _ func() error) error {
				if err := insert(2); err != nil {
					return err
				}
				return errNo
			}, "no", 1, 2, 1, 4}, // BEGIN, rows 1 and 3, COMMIT: row 2 dropped unsent
			{"fails after a round trip", func(insert func(int) error, read func() error) error {
				if err := insert(2); err != nil {
					return err
				}
				if err := read(); err != nil {
					return err
				}
				return errNo
			}, "no", 2, 2, 0, 0},
			{"its write fails once sent", func(insert func(int) error, _ func() error) error {
				if err := insert(2); err != nil {
					return err
				}
				return insert(1) // taken: fails when it goes out (at the commit, on PostgreSQL)
			}, "inserting row 1", 2, 2, 0, 0},
		} {
			t.Run(c.name, func(t *testing.T) {
				insert, ids := heldTable(t, st, fmt.Sprintf("spec_%d_t", i))
				var run runChecks
				runs := 0
				reruns, trips, stmts := st.WriterStats().Reruns, st.WriteRoundTrips(), st.WriterStats().Statements
				err := st.Write(ctx, func(tx *store.Tx) error {
					run.start()
					runs++
					ins := func(id int) error { return insert(tx, id) }
					read := func() error {
						_, err := tx.QueryIntForTests(ctx, fmt.Sprintf(`SELECT COUNT(*) FROM spec_%d_t`, i))
						return err
					}
					if err := ins(1); err != nil {
						return err
					}
					before := tx.TripsForTests()
					serr := tx.Savepoint(ctx, func() error { return c.f(ins, read) })
					if c.want == "" && serr != nil || c.want != "" && (serr == nil || !strings.Contains(serr.Error(), c.want)) {
						run.Errorf("savepoint: %v, want %q", serr, c.want)
					}
					if pg && c.name == "succeeds" && tx.TripsForTests() != before {
						run.Errorf("the savepoint took %d round trips, want none", tx.TripsForTests()-before)
					}
					return ins(3)
				})
				if err != nil {
					t.Fatal(err)
				}
				if got := st.WriteRoundTrips() - trips; pg && c.tripsPG > 0 && got != c.tripsPG {
					t.Errorf("%d round trips, want %d (BEGIN, the writes and COMMIT in one)", got, c.tripsPG)
				}
				if got := st.WriterStats().Statements - stmts; pg && c.stmtsPG > 0 && got != c.stmtsPG {
					t.Errorf("%d statements sent, want %d", got, c.stmtsPG)
				}
				run.report(t)
				if got := fmt.Sprint(ids()); c.want == "" && got != "[1 2 3]" || c.want != "" && got != "[1 3]" {
					t.Errorf("rows %s committed", got)
				}
				wantRuns := c.runsSQLite
				if pg {
					wantRuns = c.runsPG
				}
				if runs != wantRuns {
					t.Errorf("the write's function ran %d times, want %d", runs, wantRuns)
				}
				if got := st.WriterStats().Reruns - reruns; got != int64(wantRuns-1) {
					t.Errorf("writes run again: %d, want %d", got, wantRuns-1)
				}
			})
		}
	})
}

// The report of a command's outcome locks the command's node and updates the command's row in
// one round trip on PostgreSQL (LockNodeForReconcileAndUpdateCommand), the node's lock first:
// the update applies only to the row as the caller read it, and a node that does not exist
// leaves it made.
func TestLockNodeAndUpdateCommand(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		pg := st.Engine() == store.Postgres
		_, nodes := seed(t, st)
		n := nodes[0]
		for _, c := range []struct {
			name    string
			node    string
			stale   bool // the caller's copy of the row is older than the row
			applied bool
			wantErr error
		}{
			{"as read", n.ID, false, true, nil},
			{"changed since it was read", n.ID, true, false, nil},
			{"no such node", "no-such-node", false, true, store.ErrNotFound},
		} {
			t.Run(c.name, func(t *testing.T) {
				cmd := store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: "bmc.power", Args: "{}", RunsOn: "site", State: "queued", TargetAgent: "site-1"}
				if err := st.Write(ctx, func(tx *store.Tx) error { return tx.InsertCommand(ctx, &cmd) }); err != nil {
					t.Fatal(err)
				}
				was, err := st.Command(ctx, cmd.ID)
				if err != nil {
					t.Fatal(err)
				}
				if c.stale {
					was.UpdatedAt--
				}
				var run runChecks
				if err := st.Write(ctx, func(tx *store.Tx) error {
					run.start()
					next := was
					next.State, next.DeliveredAt = "delivered", tx.At()
					ln, applied, err := tx.LockNodeForReconcileAndUpdateCommand(ctx, c.node, &next, was)
					if !errors.Is(err, c.wantErr) {
						run.Errorf("err %v, want %v", err, c.wantErr)
					}
					if err == nil && ln.ID != c.node {
						run.Errorf("locked node %q, want %q", ln.ID, c.node)
					}
					if applied != c.applied {
						run.Errorf("applied %v, want %v", applied, c.applied)
					}
					if applied && next.UpdatedAt != tx.At() {
						run.Errorf("the updated row's updated_at %d, want the transaction's time %d", next.UpdatedAt, tx.At())
					}
					if pg && tx.TripsForTests() != 1 {
						run.Errorf("%d round trips, want 1 (BEGIN, both reads and the update)", tx.TripsForTests())
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				run.report(t)
				got, err := st.Command(ctx, cmd.ID)
				if err != nil {
					t.Fatal(err)
				}
				if want := map[bool]string{true: "delivered", false: "queued"}[c.applied]; got.State != want {
					t.Errorf("command %s, want %s", got.State, want)
				}
			})
		}
	})
}
