package engine

import (
	"context"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// A ramdisk command no ramdisk took, looked at within the agents' grace period, leaves the
// node due again: at the end of the grace (to tell a ramdisk gone) or at its step's next
// deadline, whichever comes first, and never in the past. A step whose timeout is shorter
// than the grace (an operator's "timeout": "5s") must not leave the node with no wake-up at
// all: nothing would ever look at it again (the sweep skips nodes with an open workflow).
func TestQueuedRamdiskStepStaysDue(t *testing.T) {
	for _, timeout := range []time.Duration{5 * time.Second, 5 * time.Minute} {
		t.Run(timeout.String(), func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				f := newWFFixture(t, st, "inspecting", "ready", []workflow.Step{{Use: "inventory.refresh", Timeout: timeout}}, nil, Config{AgentGrace: 15 * time.Second})
				f.run(t)
				if c := f.commands(t, "inventory.refresh"); len(c) != 1 || c[0].State != "queued" {
					t.Fatalf("commands: %+v", c)
				}
				for _, step := range []time.Duration{7 * time.Second, 20 * time.Minute, 20 * time.Minute} {
					f.clock.Add(step)
					if err := st.Write(ctx, func(tx *store.Tx) error { return tx.Wake(ctx, f.node.ID, "test", 0) }); err != nil {
						t.Fatal(err)
					}
					f.run(t)
					if wf := f.workflow(t); wf.State != wfRunning {
						break // ended (the ramdisk never came): nothing more is owed
					}
					ws, err := st.WakeUps(ctx, 10)
					if err != nil {
						t.Fatal(err)
					}
					if len(ws) != 1 {
						t.Fatalf("after %s: the node waits on a queued ramdisk command with no wake-up (%v)", step, ws)
					}
					if now := f.clock.Now().UnixMicro(); ws[0].DueAt <= now {
						t.Fatalf("after %s: due at %d, not after now %d", step, ws[0].DueAt, now)
					}
				}
				// The step ends: the ramdisk never came.
				if wf := f.workflow(t); wf.State == wfRunning {
					t.Errorf("workflow still running at step %d: %s", wf.StepIndex, wf.Phase)
				}
			})
		})
	}
}
