package store

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// benchUpdates times op on SQLite's writer, 100 times a write (each write with its commit), as
// UpdateWorkflow or UpdateNode runs it (whole false) and with the whole statement (whole true);
// i counts the ops.
func benchUpdates(b *testing.B, s *Store, op func(tx *Tx, i int, whole bool) error) {
	ctx := context.Background()
	for _, whole := range []bool{false, true} {
		b.Run(fmt.Sprint("whole=", whole), func(b *testing.B) {
			i := 0
			for b.Loop() {
				if err := s.Write(ctx, func(tx *Tx) error {
					for range 100 {
						i++
						if err := op(tx, i, whole); err != nil {
							return err
						}
					}
					return nil
				}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/update")
		})
	}
}

// BenchmarkUpdateWorkflow: a running workflow's step update among 20 000 workflows, with the
// statement that leaves outcome_applied and finished_at out (what UpdateWorkflow runs) and with
// the whole statement.
func BenchmarkUpdateWorkflow(b *testing.B) {
	ctx := context.Background()
	s := openTempSQLite(b)
	const n = 20000
	wfs := make([]Workflow, 0, n)
	for i := 0; i < n; i += 1000 {
		if err := s.Write(ctx, func(tx *Tx) error {
			for j := range 1000 {
				w := Workflow{NodeID: NewID(time.Now()), TenantID: "t", Profile: "p", Owner: "metal", Steps: fmt.Sprintf(`[{"use":"s%d"}]`, j), Cleanup: "[]", State: "running", Phase: "steps"}
				if err := tx.InsertWorkflow(ctx, &w); err != nil {
					return err
				}
				wfs = append(wfs, w)
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	benchUpdates(b, s, func(tx *Tx, i int, whole bool) error {
		w := wfs[(i*7919)%n]
		w.StepIndex = i
		if whole {
			_, err := tx.exec(ctx, updateWorkflowWhole, append(workflowStepArgs(&w, 0), w.OutcomeApplied, w.FinishedAt, w.ID)...)
			return err
		}
		return tx.UpdateWorkflow(ctx, &w)
	})
}

// BenchmarkUpdateNode: a node's read and update keeping its state and batch, among 10 000
// nodes: with them left out of the statement (read in the same transaction, what UpdateNode
// does) and with the whole statement (as for a node not read in the transaction).
func BenchmarkUpdateNode(b *testing.B) {
	benchUpdateNode(b, func(nd *Node, i int) { nd.Power = fmt.Sprint(i) })
}

// BenchmarkUpdateNodeState: the same with the node's state changed and its batch kept: the
// statement that sets the state alone (what UpdateNode runs) and the one that sets both.
func BenchmarkUpdateNodeState(b *testing.B) {
	benchUpdateNode(b, func(nd *Node, i int) {
		nd.State = map[string]string{"ready": "deploying", "deploying": "enrolling", "enrolling": "ready"}[nd.State]
	})
}

func benchUpdateNode(b *testing.B, change func(nd *Node, i int)) {
	ctx := context.Background()
	s := openTempSQLite(b)
	const n = 10000
	var nodes []Node
	if err := s.Write(ctx, func(tx *Tx) error {
		pool, err := seedPool(ctx, tx)
		if err != nil {
			return err
		}
		for i := range n {
			nd := redfishNode(pool, fmt.Sprint("n", i), []string{"ready", "deploying", "enrolling"}[i%3])
			if err := tx.InsertNode(ctx, &nd); err != nil {
				return err
			}
			nodes = append(nodes, nd)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	benchUpdates(b, s, func(tx *Tx, i int, whole bool) error {
		id := nodes[(i*7919)%n].ID
		nd, err := tx.LockNode(ctx, id, "")
		if err != nil {
			return err
		}
		if whole {
			delete(tx.nodes, id)
		}
		change(&nd, i)
		return tx.UpdateNode(ctx, &nd)
	})
}
