package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkUpdateWorkflow: a running workflow's step update on SQLite's writer, among 20 000
// workflows, with the statement that leaves outcome_applied and finished_at out (what
// UpdateWorkflow runs) and with the whole statement.
func BenchmarkUpdateWorkflow(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, "sqlite://"+filepath.Join(b.TempDir(), "bcd.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
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
	for _, whole := range []bool{false, true} {
		b.Run(fmt.Sprint("whole=", whole), func(b *testing.B) {
			i := 0
			for b.Loop() {
				if err := s.Write(ctx, func(tx *Tx) error {
					for range 100 {
						w := wfs[(i*7919)%n]
						i++
						w.StepIndex = i
						if whole {
							if _, err := tx.exec(ctx, `UPDATE workflows SET state = ?, phase = ?, step_index = ?, step_attempt = ?, step_started_at = ?,
		step_deadline = ?, current_command = ?, boot_epoch = ?, abort_requested = ?, fault_code = ?, error = ?, outcome_applied = ?,
		updated_at = ?, finished_at = ? WHERE id = ?`, w.State, w.Phase, w.StepIndex, w.StepAttempt, w.StepStartedAt, w.StepDeadline, w.CurrentCommand, w.BootEpoch, w.AbortRequested,
								w.FaultCode, w.Error, w.OutcomeApplied, w.UpdatedAt, w.FinishedAt, w.ID); err != nil {
								return err
							}
							continue
						}
						if err := tx.UpdateWorkflow(ctx, &w); err != nil {
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

// BenchmarkUpdateNode: UpdateNode keeping the node's state and batch, among 10 000 nodes, on
// SQLite's writer: with them left out of the statement (read in the same transaction, what
// UpdateNode does) and with the whole statement (the node not read in the transaction).
func BenchmarkUpdateNode(b *testing.B) {
	ctx := context.Background()
	s, err := Open(ctx, "sqlite://"+filepath.Join(b.TempDir(), "bcd.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	const n = 10000
	var nodes []Node
	if err := s.Write(ctx, func(tx *Tx) error {
		if err := tx.PutHardwareProfile(ctx, HardwareProfile{Name: "redfish", Drivers: map[string]string{"power": "redfish"}, LocalBoot: "exit"}); err != nil {
			return err
		}
		tn, err := tx.InsertTenant(ctx, "t")
		if err != nil {
			return err
		}
		site, err := tx.InsertSite(ctx, tn.ID, "s", nil)
		if err != nil {
			return err
		}
		pool, err := tx.InsertPool(ctx, Pool{TenantID: tn.ID, SiteID: site.ID, Name: "p", Policy: PoolPolicy{HardwareProfile: "redfish"}})
		if err != nil {
			return err
		}
		for i := range n {
			nd := Node{ID: NewID(time.Now()), TenantID: tn.ID, SiteID: site.ID, PoolID: pool.ID, Name: fmt.Sprint("n", i), State: []string{"ready", "deploying", "enrolling"}[i%3],
				HardwareProfile: "redfish", BMCDriver: "redfish", BMCAddress: "https://x", BMCUsernameRef: "secret://u", BMCPasswordRef: "secret://p"}
			if err := tx.InsertNode(ctx, &nd); err != nil {
				return err
			}
			nodes = append(nodes, nd)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	for _, whole := range []bool{false, true} {
		b.Run(fmt.Sprint("whole=", whole), func(b *testing.B) {
			i := 0
			for b.Loop() {
				if err := s.Write(ctx, func(tx *Tx) error {
					for range 100 {
						id := nodes[(i*7919)%n].ID
						i++
						nd, err := tx.LockNode(ctx, id, "")
						if err != nil {
							return err
						}
						if whole {
							delete(tx.nodes, id)
						}
						nd.Power = fmt.Sprint(i)
						if err := tx.UpdateNode(ctx, &nd); err != nil {
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
