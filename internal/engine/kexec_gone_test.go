package engine

import (
	"context"
	"testing"
	"time"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// A kexec ends the ramdisk that acknowledged it: its agent going away is how it runs, and an
// installed OS may take longer than the agents' grace period to join. The command is not lost
// when the reaper applies the ramdisk's departure; its step settles it: succeeded when the OS
// joins, failed when the step runs out of time (then the step falls back to a power cycle).
func TestKexecOutlivesItsRamdisk(t *testing.T) {
	for _, tc := range []struct {
		name      string
		osJoins   bool
		wantState string
	}{
		{"the OS joins after the grace period", true, "succeeded"},
		{"the OS never joins", false, "failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				f := newWFFixture(t, st, "deploying", "deployed", []workflow.Step{{Use: "boot.kexecOnce", Timeout: 10 * time.Minute}}, nil,
					Config{AgentGrace: 15 * time.Second})
				f.run(t)
				ramdisk := Agent{ID: NodeAgentID("node", f.node.ID), Kind: "node", NodeID: f.node.ID, Generation: f.node.IdentityGeneration, ConnID: "boot-1"}
				if err := f.e.Connected(ctx, ramdisk, "v"); err != nil {
					t.Fatal(err)
				}
				got, err := f.e.Claim(ctx, ramdisk, 10)
				if err != nil || len(got) != 1 || got[0].Kind != "boot.kexec" {
					t.Fatalf("claim: %+v %v", got, err)
				}
				kexec := got[0].ID
				if err := f.e.Ack(ctx, ramdisk, kexec); err != nil {
					t.Fatal(err)
				}
				// The kexec: the ramdisk's connection ends, and stays gone past the grace.
				if err := f.e.Disconnected(ctx, ramdisk); err != nil {
					t.Fatal(err)
				}
				f.clock.Add(time.Minute)
				if err := f.e.reapAgents(ctx); err != nil {
					t.Fatal(err)
				}
				f.run(t)
				c, err := st.Command(ctx, kexec)
				if err != nil {
					t.Fatal(err)
				}
				if c.State != "delivered" {
					t.Fatalf("after its ramdisk's departure the kexec is %s (%s), want delivered: its step settles it", c.State, c.Error)
				}
				if tc.osJoins {
					os := Agent{ID: NodeAgentID("os", f.node.ID), Kind: "os", NodeID: f.node.ID, Generation: f.node.IdentityGeneration, ConnID: "os-1"}
					if err := f.e.Connected(ctx, os, "v"); err != nil {
						t.Fatal(err)
					}
				} else {
					f.clock.Add(10 * time.Minute)
					if err := st.Write(ctx, func(tx *store.Tx) error { return tx.Wake(ctx, f.node.ID, "test", 0) }); err != nil {
						t.Fatal(err)
					}
				}
				f.run(t)
				if c, err = st.Command(ctx, kexec); err != nil {
					t.Fatal(err)
				}
				if c.State != tc.wantState {
					t.Errorf("kexec %s (%s), want %s", c.State, c.Error, tc.wantState)
				}
				if wf := f.workflow(t); wf.State == wfRunning && wf.StepIndex == 0 {
					t.Errorf("the kexec's step is still waiting: %+v", wf)
				}
				if lost := f.e.lost.Load(); lost != 0 {
					t.Errorf("%d commands counted lost", lost)
				}
			})
		})
	}
}
