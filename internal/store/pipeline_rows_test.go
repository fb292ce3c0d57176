package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A read of several rows (Tx.query) goes out on PostgreSQL in the same round trip as the writes
// held before it (the transaction's BEGIN among them), sees them, and decodes what it reads as a
// read of one row does; a write returning rows (UPDATE … RETURNING) goes after a held savepoint,
// so that the savepoint's rollback undoes it; its failure is the savepoint's.
func TestPipelinedRows(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		pg := st.Engine() == store.Postgres
		insert, ids := heldTable(t, st, "rows_t")
		var run runChecks
		pairs := func(tx *store.Tx, q string, args ...any) string {
			got, err := tx.QueryPairsForTests(ctx, q, args...)
			if err != nil {
				run.Errorf("%s: %v", q, err)
			}
			return strings.Join(got, " ")
		}
		if err := st.Write(ctx, func(tx *store.Tx) error {
			run.start()
			for id := 1; id <= 3; id++ {
				if err := insert(tx, id); err != nil {
					return err
				}
			}
			// BEGIN, three inserts and the read: one round trip.
			if got := pairs(tx, `SELECT id, v FROM rows_t ORDER BY id`); got != "1=v 2=v 3=v" {
				run.Errorf("read after held writes: %q", got)
			}
			if pg && (tx.TripsForTests() != 1 || tx.HeldForTests() != 0) {
				run.Errorf("a read after held writes: %d round trips, %d held; want 1, 0", tx.TripsForTests(), tx.HeldForTests())
			}
			// Nothing found; a read after many held writes.
			if got := pairs(tx, `SELECT id, v FROM rows_t WHERE id > 99`); got != "" {
				run.Errorf("read of no row: %q", got)
			}
			for id := 4; id <= 30; id++ {
				if err := insert(tx, id); err != nil {
					return err
				}
			}
			if got := pairs(tx, `SELECT id, v FROM rows_t WHERE id >= 28 ORDER BY id`); got != "28=v 29=v 30=v" {
				run.Errorf("read after 27 held writes: %q", got)
			}
			// A write returning rows, after a held write: both in one round trip.
			before := tx.TripsForTests()
			if err := insert(tx, 31); err != nil {
				return err
			}
			if got := pairs(tx, `UPDATE rows_t SET v = 'u' WHERE id IN (1, 31) RETURNING id, v`); got != "1=u 31=u" && got != "31=u 1=u" {
				run.Errorf("UPDATE … RETURNING after a held write: %q", got)
			}
			if pg && tx.TripsForTests()-before != 1 {
				run.Errorf("UPDATE … RETURNING after a held write: %d round trips, want 1", tx.TripsForTests()-before)
			}
			// Its failure is the statement's, and the transaction is then rolled back to the
			// savepoint around it, which undoes the held write before it as well.
			errNo := errors.New("no")
			err := tx.Savepoint(ctx, func() error {
				if err := insert(tx, 32); err != nil {
					return err
				}
				if _, err := tx.QueryPairsForTests(ctx, `UPDATE rows_t SET id = 2 WHERE id = 3 RETURNING id, v`); err == nil {
					run.Errorf("an UPDATE … RETURNING breaking the primary key succeeded")
				}
				return errNo
			})
			if !errors.Is(err, errNo) {
				run.Errorf("savepoint: %v, want its function's error", err)
			}
			err = tx.Savepoint(ctx, func() error {
				if _, err := tx.QueryPairsForTests(ctx, `UPDATE rows_t SET v = 'x' WHERE id = 2 RETURNING id, v`); err != nil {
					return err
				}
				return errNo
			})
			if !errors.Is(err, errNo) {
				run.Errorf("savepoint: %v, want its function's error", err)
			}
			if got := pairs(tx, `SELECT id, v FROM rows_t WHERE id IN (1, 2, 3, 32) ORDER BY id`); got != "1=u 2=v 3=v" {
				run.Errorf("after the rolled back savepoints: %q, want 1=u 2=v 3=v", got)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		run.report(t)
		want := make([]int, 0, 31)
		for id := 1; id <= 31; id++ {
			want = append(want, id)
		}
		if got := ids(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("rows stored %v, want %v", got, want)
		}
	})
}

// LockNodeForReconcile reads a node's row, locked, with its wake sequence and its open workflow
// (on PostgreSQL in the round trip of the transaction's BEGIN): a node with an open workflow,
// one whose only workflow ended, and one that does not exist.
func TestLockNodeForReconcile(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		pg := st.Engine() == store.Postgres
		_, nodes := seed(t, st)
		now := time.Now()
		open := store.Workflow{ID: store.NewID(now), NodeID: nodes[0].ID, TenantID: nodes[0].TenantID, Profile: "p", Owner: "metal",
			NodeState: "inspecting", Steps: "[]", Cleanup: "[]", State: "running", Phase: "steps"}
		ended := open
		ended.ID, ended.NodeID, ended.State, ended.OutcomeApplied = store.NewID(now), nodes[1].ID, "succeeded", true
		if err := st.Write(ctx, func(tx *store.Tx) error {
			for _, wf := range []*store.Workflow{&open, &ended} {
				if err := tx.InsertWorkflow(ctx, wf); err != nil {
					return err
				}
			}
			return tx.Wake(ctx, nodes[0].ID, "test", 0)
		}); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name, node string
			wantWF     string // the open workflow's id; "": none
			wantSeq    bool   // a wake sequence above 0
			wantErr    error
		}{
			{"open workflow, woken", nodes[0].ID, open.ID, true, nil},
			{"its workflow ended", nodes[1].ID, "", false, nil},
			{"no such node", "no-such-node", "", false, store.ErrNotFound},
		} {
			t.Run(c.name, func(t *testing.T) {
				if err := st.Write(ctx, func(tx *store.Tx) error {
					ln, err := tx.LockNodeForReconcile(ctx, c.node)
					if c.wantErr != nil {
						if !errors.Is(err, c.wantErr) {
							t.Errorf("err %v, want %v", err, c.wantErr)
						}
						return nil
					}
					if err != nil {
						return err
					}
					if pg && tx.TripsForTests() != 1 {
						t.Errorf("%d round trips, want 1 (BEGIN and both reads)", tx.TripsForTests())
					}
					if ln.ID != c.node || ln.Open != (c.wantWF != "") || ln.Workflow.ID != c.wantWF || (ln.Seq > 0) != c.wantSeq {
						t.Errorf("node %q open %v workflow %q seq %d; want node %q workflow %q seq>0 %v",
							ln.ID, ln.Open, ln.Workflow.ID, ln.Seq, c.node, c.wantWF, c.wantSeq)
					}
					if ln.Open && (ln.Workflow.NodeState != "inspecting" || ln.Workflow.State != "running") {
						t.Errorf("workflow read as %+v", ln.Workflow)
					}
					if !pg {
						// Again: SQLite's writer takes the node from its cache (and reads its
						// wake sequence alone), as LockNode does.
						hits := st.WriterStats().NodeHits
						again, err := tx.LockNodeForReconcile(ctx, c.node)
						if err != nil {
							return err
						}
						if st.WriterStats().NodeHits != hits+1 || again.Seq != ln.Seq || again.Version != ln.Version {
							t.Errorf("read again: %d node hits, want 1; seq %d version %d, want %d %d",
								st.WriterStats().NodeHits-hits, again.Seq, again.Version, ln.Seq, ln.Version)
						}
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}
