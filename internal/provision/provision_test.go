package provision

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// expected is written independently of the rules table: for each verb, the states in which a
// resting node without maintenance accepts it, and the state it moves to.
var expectedResting = map[Verb]map[State]State{
	VerbManage:   {Ready: Manageable},
	VerbInspect:  {Manageable: Inspecting, Ready: Inspecting},
	VerbProvide:  {Manageable: Commissioning},
	VerbDeploy:   {Ready: Deploying},
	VerbUndeploy: {Deployed: Releasing, Rescue: Releasing},
	VerbRescue:   {Deployed: Rescue},
	VerbUnrescue: {Rescue: Rescue},
	VerbRetire:   {Manageable: Retiring, Ready: Retiring, Deployed: Retiring, Failed: Retiring},
	VerbPower:    {Manageable: Manageable, Ready: Ready, Deployed: Deployed, Rescue: Rescue, Failed: Failed, Retired: Retired},
	VerbDelete:   {Manageable: Manageable, Ready: Ready, Retired: Retired, Failed: Failed},
	VerbRecover:  {Failed: Retiring}, // with failed_from retiring, see below
	VerbAbort:    {},
}

var workflowDriven = []State{Enrolling, Inspecting, Commissioning, Deploying, Releasing, Rescue, Retiring}

func TestEveryStateVerbPair(t *testing.T) {
	for _, s := range States() {
		for _, busy := range []bool{false, true} {
			info, _ := Info(s)
			if busy && info.Kind == Resting || !busy && info.Kind == WorkflowDriven {
				continue // not a reachable combination
			}
			for _, maint := range []bool{false, true} {
				for _, v := range Verbs() {
					n := Node{State: s, Maintenance: maint}
					if busy {
						n.Target = Ready
					}
					if s == Failed {
						n.FailedFrom = Retiring
						n.Target = Retired
					}
					name := fmt.Sprintf("%s/busy=%v/maint=%v/%s", s, busy, maint, v)
					m, err := Decide(n, v)
					want, wantOK := expect(n, v)
					if wantOK != (err == nil) {
						t.Errorf("%s: accepted=%v, want %v (err %v)", name, err == nil, wantOK, err)
						continue
					}
					if err != nil {
						var re *RefusedError
						if v != VerbEnroll && !errors.As(err, &re) {
							t.Errorf("%s: error %T, want *RefusedError", name, err)
							continue
						}
						msg := err.Error()
						if !strings.Contains(msg, string(s)) || !strings.Contains(msg, "verbs accepted now") && v != VerbEnroll {
							t.Errorf("%s: error %q must name the state and the accepted verbs", name, msg)
						}
						if slices.Contains(Accepted(n), v) {
							t.Errorf("%s: refused but listed in Accepted", name)
						}
						continue
					}
					if !slices.Contains(Accepted(n), v) {
						t.Errorf("%s: accepted but missing from Accepted %v", name, Accepted(n))
					}
					if m.To != want {
						t.Errorf("%s: to %s, want %s", name, m.To, want)
					}
				}
			}
		}
	}
}

func expect(n Node, v Verb) (State, bool) {
	switch v {
	case VerbEnroll:
		return "", false
	case VerbMaintenance:
		return n.State, true
	case VerbAbort:
		return Failed, n.Busy()
	}
	if n.Busy() {
		return "", false
	}
	if v == VerbDelete && n.State == Failed && (n.FailedFrom == Deploying || n.FailedFrom == Releasing || n.FailedFrom == Rescue || n.FailedFrom == Retiring) {
		return "", false
	}
	inMaint := v == VerbPower || v == VerbDelete || v == VerbRecover
	if n.Maintenance && !inMaint {
		return "", false
	}
	to, ok := expectedResting[v][n.State]
	return to, ok
}

func TestRecoverTargets(t *testing.T) {
	cases := []struct {
		failedFrom, target State
		to, wantTarget     State
		ok                 bool
	}{
		{Enrolling, Ready, Enrolling, Ready, true},
		{Inspecting, Manageable, Inspecting, Manageable, true},
		{Commissioning, Ready, Commissioning, Ready, true},
		{Deploying, Deployed, Releasing, Ready, true}, // wipe before ready
		{Releasing, Ready, Releasing, Ready, true},
		{Rescue, Deployed, Rescue, Deployed, true},
		{Retiring, Retired, Retiring, Retired, true},
		{Retiring, "", Retiring, Retired, true},
		{Ready, "", "", "", false},
		{"", "", "", "", false},
	}
	for _, c := range cases {
		n := Node{State: Failed, FailedFrom: c.failedFrom, Target: c.target, Maintenance: true}
		m, err := Decide(n, VerbRecover)
		if (err == nil) != c.ok {
			t.Errorf("recover from %q: err %v, want ok=%v", c.failedFrom, err, c.ok)
			continue
		}
		if !c.ok {
			continue
		}
		if m.To != c.to || m.Target != c.wantTarget || !m.ClearFault || !m.Wakes {
			t.Errorf("recover from %q: %+v, want to %s target %s, clearing the fault", c.failedFrom, m, c.to, c.wantTarget)
		}
	}
}

func TestAbortAndFail(t *testing.T) {
	for _, s := range workflowDriven {
		n := Node{State: s, Target: Ready}
		m, err := Decide(n, VerbAbort)
		if err != nil {
			t.Fatalf("abort in %s: %v", s, err)
		}
		if m.To != Failed || m.FailedFrom != s || !m.MaintenanceOn || m.Fault != FaultAborted || m.Target != Ready || !m.Wakes {
			t.Errorf("abort in %s: %+v", s, m)
		}
		f := Fail(n, FaultUnverifiedWipe)
		if f.To != Failed || f.FailedFrom != s || !f.MaintenanceOn || f.Fault != FaultUnverifiedWipe {
			t.Errorf("fail in %s: %+v", s, f)
		}
		// The failed node rests, keeps its target, and recover brings it back.
		failed := Node{State: Failed, FailedFrom: s, Target: Ready, Maintenance: true}
		if failed.Busy() {
			t.Errorf("failed node from %s reports busy", s)
		}
		if _, err := Decide(failed, VerbRecover); err != nil {
			t.Errorf("recover after failing in %s: %v", s, err)
		}
	}
}

func TestDeleteRefusedWhenFailedHoldingData(t *testing.T) {
	for _, ff := range []State{Deploying, Releasing, Rescue, Retiring} {
		_, err := Decide(Node{State: Failed, FailedFrom: ff, Target: Ready}, VerbDelete)
		if err == nil || !strings.Contains(err.Error(), "recover or retire it first") {
			t.Errorf("delete of node failed from %s: %v", ff, err)
		}
	}
	for _, ff := range []State{Enrolling, Inspecting, Commissioning} {
		if _, err := Decide(Node{State: Failed, FailedFrom: ff, Target: Ready}, VerbDelete); err != nil {
			t.Errorf("delete of node failed from %s: %v", ff, err)
		}
	}
}

func TestChains(t *testing.T) {
	// enroll chain: enrolling -> inspecting -> commissioning -> ready.
	m := EnrollMove()
	state, target := m.To, m.Target
	var path []State
	for target != "" {
		next, nt, err := Complete(state, target, VerbEnroll)
		if err != nil {
			t.Fatal(err)
		}
		path = append(path, next)
		state, target = next, nt
		if len(path) > 10 {
			t.Fatal("chain does not end")
		}
	}
	if want := []State{Inspecting, Commissioning, Ready}; !slices.Equal(path, want) {
		t.Errorf("enroll chain %v, want %v", path, want)
	}
	cases := []struct {
		from   State
		verb   Verb
		chain  []State
		rested State
	}{
		{Manageable, VerbInspect, nil, Manageable},
		{Ready, VerbInspect, nil, Ready},
		{Manageable, VerbProvide, nil, Ready},
		{Ready, VerbDeploy, nil, Deployed},
		{Deployed, VerbUndeploy, nil, Ready},
		{Rescue, VerbUndeploy, nil, Ready},
		{Deployed, VerbRescue, nil, Rescue},
		{Rescue, VerbUnrescue, nil, Deployed},
		{Failed, VerbRetire, nil, Retired},
	}
	for _, c := range cases {
		m, err := Decide(Node{State: c.from}, c.verb)
		if err != nil {
			t.Fatalf("%s from %s: %v", c.verb, c.from, err)
		}
		next, nt, err := Complete(m.To, m.Target, c.verb)
		if err != nil {
			t.Fatalf("%s from %s: complete: %v", c.verb, c.from, err)
		}
		if next != c.rested || nt != "" {
			t.Errorf("%s from %s: rests in %s (target %q), want %s", c.verb, c.from, next, nt, c.rested)
		}
	}
	for _, s := range []State{Manageable, Ready, Deployed, Retired, Failed} {
		if _, _, err := Complete(s, "", VerbInspect); err == nil {
			t.Errorf("complete in resting %s accepted", s)
		}
	}
}

func TestProfiles(t *testing.T) {
	want := map[State]string{Enrolling: "metal-enroll", Inspecting: "metal-inspect", Commissioning: "metal-commission", Releasing: "metal-release", Retiring: "metal-retire"}
	for s, p := range want {
		info, _ := Info(s)
		if got := info.Profile(Ready); got != p {
			t.Errorf("%s runs %q, want %q", s, got, p)
		}
	}
	info, _ := Info(Rescue)
	if info.Profile(Rescue) != "metal-rescue" || info.Profile(Deployed) != "metal-unrescue" {
		t.Errorf("rescue profiles: %q %q", info.Profile(Rescue), info.Profile(Deployed))
	}
}

func TestParse(t *testing.T) {
	if _, err := ParseState("ready"); err != nil {
		t.Error(err)
	}
	_, err := ParseState("avaliable")
	if err == nil || !strings.Contains(err.Error(), "accepted are enrolling") {
		t.Errorf("bad state: %v", err)
	}
	_, err = Decide(Node{State: Ready}, "frobnicate")
	if err == nil || !strings.Contains(err.Error(), "accepted are enroll, manage") {
		t.Errorf("bad verb: %v", err)
	}
}
