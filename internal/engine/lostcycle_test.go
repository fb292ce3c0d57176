package engine

import (
	"context"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// A power cycle whose agent went away after acknowledging it (lost) may have run: no query can
// tell, so it is never retried as it is — a second cycle would reset a machine the first one
// may be booting (DESIGN §5: bmc.power is never executed twice). A cycle the agent reported
// failed did not happen and is retried by the step's policy; a power off that was lost is
// settled by a power query.
func TestLostPowerCycleIsNotSentAgain(t *testing.T) {
	for _, tc := range []struct {
		name    string
		step    workflow.Step
		outcome string // "lost" or "failed"
		cycles  int    // bmc.power commands the workflow sends in all
		wfState string // the workflow's end
	}{
		{"cycle lost", workflow.Step{Use: "power.cycle"}, "lost", 1, wfFailed},
		{"setPower reset lost", workflow.Step{Use: "power.setPower", Args: map[string]string{"action": "reset"}}, "lost", 1, wfFailed},
		{"cycle failed", workflow.Step{Use: "power.cycle"}, "failed", 2, wfFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				f := newWFFixture(t, st, "rescue", "deployed", []workflow.Step{tc.step}, nil, Config{AgentGrace: time.Second})
				f.run(t)
				// The agent takes each cycle and loses it (or fails it); a retry, if any, the same.
				for i := 0; i < 4; i++ {
					a := f.site
					a.ConnID = a.ConnID + string(rune('a'+i))
					if err := f.e.Connected(ctx, a, "v"); err != nil {
						t.Fatal(err)
					}
					cmds, err := f.e.Claim(ctx, a, 10)
					if err != nil {
						t.Fatal(err)
					}
					if len(cmds) == 0 {
						if err := f.e.Disconnected(ctx, a); err != nil {
							t.Fatal(err)
						}
						break
					}
					for _, c := range cmds {
						if err := f.e.Ack(ctx, a, c.ID); err != nil {
							t.Fatal(err)
						}
						if tc.outcome == "failed" {
							if err := f.e.Report(ctx, a, Update{CommandID: c.ID, State: "failed", Error: "BMC said no"}); err != nil {
								t.Fatal(err)
							}
						}
					}
					if err := f.e.Disconnected(ctx, a); err != nil {
						t.Fatal(err)
					}
					f.clock.Add(2 * time.Second)
					if _, err := f.e.ReapForTests(ctx); err != nil {
						t.Fatal(err)
					}
					f.run(t)
				}
				if got := len(f.commands(t, "bmc.power")); got != tc.cycles {
					t.Errorf("%d bmc.power commands sent, want %d", got, tc.cycles)
				}
				if wf := f.workflow(t); wf.State != tc.wfState {
					t.Errorf("workflow %s (%s: %s), want %s", wf.State, wf.FaultCode, wf.Error, tc.wfState)
				}
				if n := f.nodeNow(t); n.State != "failed" || !n.Maintenance {
					t.Errorf("node %s maintenance %v, want failed in maintenance", n.State, n.Maintenance)
				}
			})
		})
	}
}
