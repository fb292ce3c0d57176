package sim

import (
	"context"
	"strings"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// TestCommissionWithDCGMOverriddenOff: a machine whose GPU diagnostics cannot run (a GPU and no
// dcgmi in the ramdisk: here diag.dcgm never finishes) does not pass commissioning, until the
// operator overrides metal-commission with diag.dcgm level 0, through the API (stored) or the
// server's profiles file (the engine's configured profiles): then commissioning passes, no
// diag.dcgm is sent, and the step is recorded as skipped by override.
func TestCommissionWithDCGMOverriddenOff(t *testing.T) {
	const off = `{"override":{"diag.dcgm":{"args":{"level":"0"}},"disk.wipe":{"args":{"mode":"full"}}}}`
	fileProfile, err := workflow.ParseProfile("metal-commission", []byte(off))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		api     bool
		file    []workflow.Profile
		skipped bool
	}{
		{name: "no override: the diagnostics hold commissioning"},
		{name: "override through the API", api: true, skipped: true},
		{name: "override through the profiles file", file: []workflow.Profile{fileProfile}, skipped: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			st := storetest.Open(t, store.SQLite)
			h, err := Start(ctx, st, Config{}, engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond, Profiles: tc.file}, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(h.Stop)
			if tc.api {
				if err := h.Metal.PutDeployProfile(ctx, h.Admin, "metal-commission", off); err != nil {
					t.Fatal(err)
				}
			}
			h.Sim.SetFaults(Faults{Hang: map[string]bool{"diag.dcgm": true}})
			ids, err := h.Enroll(ctx, "gpu", 1)
			if err != nil {
				t.Fatal(err)
			}
			id := ids[0]
			if !tc.skipped {
				waitFor(t, "diag.dcgm taken by the ramdisk", func() bool {
					cmds, _ := st.Commands(ctx, id, 500)
					for _, c := range cmds {
						if c.Kind == "diag.dcgm" && c.State == "delivered" {
							return true
						}
					}
					return false
				})
				if n, _ := st.Node(ctx, id, ""); n.State != "commissioning" {
					t.Fatalf("node %s while its diagnostics hang", n.State)
				}
				return
			}
			n := rest(t, h, ids)[id]
			if n.State != "ready" {
				t.Fatalf("node %s %s: %s", n.State, n.FaultCode, n.FaultMsg)
			}
			cmds, err := st.Commands(ctx, id, 500)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range cmds {
				if c.Kind == "diag.dcgm" {
					t.Errorf("diag.dcgm sent: %+v", c)
				}
				if c.Kind == "disk.wipe" && !strings.Contains(c.Args, `"full"`) {
					t.Errorf("commissioning wipe %s, want the override's full", c.Args)
				}
			}
			var wf store.Workflow
			for _, w := range workflowsOf(t, st, id) {
				if w.Profile == "metal-commission" {
					wf = w
				}
			}
			if !strings.Contains(wf.Steps, `"when":"skippedByOverride"`) || strings.Contains(strings.Join(wf.CommandKinds, " "), "diag.dcgm") {
				t.Errorf("recorded workflow: steps %s kinds %v", wf.Steps, wf.CommandKinds)
			}
			evs, err := st.Events(ctx, store.EventFilter{NodeID: id, Limit: 10000})
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, e := range evs {
				if e.Kind == "workflow.step" && strings.Contains(e.Data, `"result":"skipped"`) && strings.Contains(e.Data, "diag.dcgm?skippedByOverride{level: 0}") {
					found = strings.Contains(e.Reason, "skipped by override of profile metal-commission")
				}
			}
			if !found {
				t.Errorf("no workflow.step event recording the skip by override among %d events", len(evs))
			}
		})
	}
}

// TestWorkflowsFollowTheStoredProfileOfTheirStart: the engine keeps the profiles it resolved
// (run.resolveWorkflow), and a workflow starts with the stored definition of its start, never
// one kept from before: a node enrolled before an override sends diag.dcgm, one enrolled after
// it does not, one enrolled after it is replaced by an override that keeps diag.dcgm sends it,
// and so does one enrolled after the override is deleted. One engine runs the four.
func TestWorkflowsFollowTheStoredProfileOfTheirStart(t *testing.T) {
	const off = `{"override":{"diag.dcgm":{"args":{"level":"0"}}}}`
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h := startEmpty(t, st, 0)
	sentDCGM := func(prefix string) bool {
		t.Helper()
		h.salt++ // another MAC and product UUID than the last node's
		ids, err := h.Enroll(ctx, prefix, 1)
		if err != nil {
			t.Fatal(err)
		}
		if n := rest(t, h, ids)[ids[0]]; n.State != "ready" {
			t.Fatalf("%s: node %s %s: %s", prefix, n.State, n.FaultCode, n.FaultMsg)
		}
		cmds, err := st.Commands(ctx, ids[0], 500)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cmds {
			if c.Kind == "diag.dcgm" {
				return true
			}
		}
		return false
	}
	if !sentDCGM("before") {
		t.Error("enrolled before the override: no diag.dcgm sent")
	}
	if err := h.Metal.PutDeployProfile(ctx, h.Admin, "metal-commission", off); err != nil {
		t.Fatal(err)
	}
	if sentDCGM("overridden") {
		t.Error("enrolled after the override: diag.dcgm sent (a profile kept from before the override)")
	}
	if err := h.Metal.PutDeployProfile(ctx, h.Admin, "metal-commission", `{"override":{"disk.wipe":{"args":{"mode":"full"}}}}`); err != nil {
		t.Fatal(err)
	}
	if !sentDCGM("replaced") {
		t.Error("enrolled after the override was replaced by one that keeps diag.dcgm: no diag.dcgm sent (the first override's profile kept)")
	}
	if err := h.Metal.DeleteDeployProfile(ctx, h.Admin, "metal-commission"); err != nil {
		t.Fatal(err)
	}
	if !sentDCGM("after") {
		t.Error("enrolled after the override was deleted: no diag.dcgm sent (the override's profile kept)")
	}
}
