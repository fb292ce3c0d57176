package scenario

import (
	"strings"
	"testing"

	"bcd/internal/gen/bcdv1"
)

// TestLine: a node's line shows its step while it works and, resting, its address.
func TestLine(t *testing.T) {
	running := &bcdv1.Activity{Workflow: "default", WorkflowState: "running", Step: 7, Steps: 13, StepName: "deploy.image{image: os}",
		CommandKind: "deploy.image", CommandState: "running", ProgressDone: 1, ProgressTotal: 4}
	addr := []*bcdv1.NodeAddress{{Mac: "52:54:00:00:00:01", Ip: "172.30.0.100"}}
	tests := []struct {
		name string
		n    *bcdv1.Node
		want []string
		not  []string
	}{
		{"a step in progress", &bcdv1.Node{Name: "lab-0", State: "deploying", TargetState: "deployed", Activity: running, Addresses: addr},
			[]string{"lab-0", "deploying → deployed", "default 8/13 deploy.image{image: os} (running) 25%", "[####"}, []string{"172.30.0.100"}},
		{"resting, with its address", &bcdv1.Node{Name: "lab-0", State: "deployed", Addresses: addr},
			[]string{"deployed", "[########]  172.30.0.100"}, nil},
		{"resting, no address", &bcdv1.Node{Name: "lab-1", State: "ready"}, []string{"ready", "[########]"}, []string{"172.30"}},
		{"failed", &bcdv1.Node{Name: "lab-1", State: "failed", FaultCode: "STEP_FAILED", Addresses: addr}, []string{"failed [STEP_FAILED]", "172.30.0.100"}, nil},
	}
	for _, tc := range tests {
		got := Line(tc.n, 8)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.name, got, w)
			}
		}
		for _, w := range tc.not {
			if strings.Contains(got, w) {
				t.Errorf("%s: %q has %q", tc.name, got, w)
			}
		}
	}
}
