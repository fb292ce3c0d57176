package engine

import (
	"fmt"
	"slices"
	"testing"

	"bcd/internal/batch"
	"bcd/internal/provision"
	"bcd/internal/workflow"
)

// The kinds an engine keeps for a chain are batch.ChainKinds' for the same chain, target and
// parameters, whatever it computed before: chains, targets and parameters interleaved, each
// asked twice (the second from what was kept), and a configured profile honoured.
func TestChainKindsKeptAreChainKinds(t *testing.T) {
	noDCGM, err := workflow.ParseProfile("metal-commission", []byte(`{"override":{"diag.dcgm":{"args":{"level":"0"}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, profiles := range [][]workflow.Profile{nil, {noDCGM}} {
		e := New(nil, nil, nil, Config{Profiles: profiles})
		cases := []struct {
			rest        []provision.State
			target      provision.State
			wipe, image string
		}{
			{[]provision.State{provision.Inspecting, provision.Commissioning}, provision.Ready, "quick", ""},
			{[]provision.State{provision.Commissioning}, provision.Ready, "quick", ""},
			{[]provision.State{provision.Commissioning}, provision.Ready, "full", ""},
			{[]provision.State{provision.Inspecting}, provision.Manageable, "quick", ""},
			{[]provision.State{provision.Releasing}, provision.Ready, "secure", "debian"},
			{[]provision.State{provision.Inspecting, provision.Commissioning}, provision.Ready, "quick", "x"},
		}
		for round := range 2 {
			for _, c := range cases {
				want, werr := batch.ChainKinds(c.rest, c.target, batch.BuiltinProfileOf(profiles), map[string]string{"wipe": c.wipe, "image": c.image})
				got, err := e.chainKinds(c.rest, c.target, c.wipe, c.image)
				if fmt.Sprint(err) != fmt.Sprint(werr) || !slices.Equal(got, want) {
					t.Errorf("profiles %d, round %d, %v → %s %s/%s: %v %v, want %v %v", len(profiles), round, c.rest, c.target, c.wipe, c.image, got, err, want, werr)
				}
			}
		}
		withDCGM, _ := e.chainKinds([]provision.State{provision.Commissioning}, provision.Ready, "quick", "")
		if slices.Contains(withDCGM, "diag.dcgm") == (profiles != nil) {
			t.Errorf("configured profiles %d: commissioning kinds %v", len(profiles), withDCGM)
		}
	}
}
