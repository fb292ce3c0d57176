package engine

import (
	"encoding/json"
	"testing"

	"bcd/internal/store"
	"bcd/internal/workflow"
)

// TestBuildCommandBootMode: every bmc.boot command of the built-in profiles carries the node's
// boot mode, an explicit step mode wins, and a node without one sends no mode (the driver's
// behaviour). Other BMC commands never get a mode.
func TestBuildCommandBootMode(t *testing.T) {
	builtin := func(name string) []workflow.Step {
		t.Helper()
		p, err := workflow.Find(name, nil)
		if err != nil {
			t.Fatal(err)
		}
		r, err := workflow.Resolve(p, map[string]string{"image": "debian", "wipe": "quick"})
		if err != nil {
			t.Fatal(err)
		}
		return r.Steps
	}
	explicit := workflow.Step{Use: "management.setBootDevice", Args: map[string]string{"device": "cd", "mode": "uefi"}}
	tests := []struct {
		name     string
		nodeMode string
		steps    []workflow.Step
		want     string // mode of every bmc.boot command; "" for none
	}{
		{"legacy node, inspect (ensureRamdisk: pxe)", "legacy", builtin("metal-inspect"), "legacy"},
		{"legacy node, deploy (pxe, then disk)", "legacy", builtin("default"), "legacy"},
		{"legacy node, unrescue (disk)", "legacy", builtin("metal-unrescue"), "legacy"},
		{"uefi node, deploy", "uefi", builtin("default"), "uefi"},
		{"node without mode, deploy", "", builtin("default"), ""},
		{"legacy node, step says uefi", "legacy", []workflow.Step{explicit}, "uefi"},
		{"node without mode, step says uefi", "", []workflow.Step{explicit}, "uefi"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &run{n: store.Node{ID: "n1", BMCDriver: "ipmi", BMCAddress: "10.0.0.5", BootMode: tt.nodeMode, MACs: []string{"52:54:00:aa:bb:01"}}}
			boots := 0
			for _, st := range tt.steps {
				k, err := workflow.LookupStep(st.Use)
				if err != nil {
					t.Fatal(err)
				}
				if k.Command == "" || k.Command[:4] != "bmc." || k.Command == "bmc.media" {
					continue
				}
				c, err := r.buildCommand(&store.Workflow{ID: "w1"}, st, k.Command)
				if err != nil {
					t.Fatalf("%s: %v", st.Use, err)
				}
				var args map[string]any
				if err := json.Unmarshal([]byte(c.Args), &args); err != nil {
					t.Fatal(err)
				}
				mode, has := args["mode"]
				if k.Command != "bmc.boot" {
					if has {
						t.Errorf("%s (%s) carries mode %v", st.Use, k.Command, mode)
					}
					continue
				}
				boots++
				if tt.want == "" && has {
					t.Errorf("%s carries mode %v, want none", st, mode)
				}
				if tt.want != "" && mode != tt.want {
					t.Errorf("%s carries mode %v, want %s", st, mode, tt.want)
				}
				if args["device"] != st.Args["device"] {
					t.Errorf("%s: device %v, want %s", st, args["device"], st.Args["device"])
				}
			}
			if boots == 0 {
				t.Fatal("no bmc.boot command was built")
			}
		})
	}
}
