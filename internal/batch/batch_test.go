package batch

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"bcd/internal/command"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

func kind(t *testing.T, name string) command.Kind {
	t.Helper()
	k, err := command.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSubject(t *testing.T) {
	cases := []struct{ kind, agent, want string }{
		{"disk.wipe", "", "n1"},
		{"deploy.image", "", "n1"},
		{"boot.kexec", "", "n1"},
		{"bmc.power", "sa-1", "bmc:sa-1/10.0.0.5"},
		{"bmc.boot", "sa-2", "bmc:sa-2/10.0.0.5"},
		{"bmc.rotate", "sa-1", "bmc:sa-1/10.0.0.5"},
		{"site.httpProxy", "sa-1", "node:n1"},
		// Run by the node's ramdisk (before the BMC's address is known): the node.
		{"bmc.provisionInband", "", "n1"},
	}
	for _, c := range cases {
		if got := Subject(kind(t, c.kind), "n1", "10.0.0.5", c.agent); got != c.want {
			t.Errorf("Subject(%s via %q) = %q, want %q", c.kind, c.agent, got, c.want)
		}
	}
	for stored, want := range map[string]string{"bmc:https://10.0.0.5": "bmc:sa-9/https://10.0.0.5", "n1": "n1", "node:n1": "node:n1"} {
		if got := AgentSubject(stored, "sa-9"); got != want {
			t.Errorf("AgentSubject(%q) = %q, want %q", stored, got, want)
		}
	}
}

// TestScopeCoversEveryAgent: BMC work gets one leaf per site agent of the site, so a command
// rerouted to another agent (failover) finds its leaf; the node's own work one leaf; nothing
// non-destructive.
func TestScopeCoversEveryAgent(t *testing.T) {
	leaves, err := Scope([]Target{{NodeID: "n1", BMCAddress: "a1", Kinds: []string{"bmc.boot", "bmc.power", "bmc.query", "boot.prepareRamdisk", "disk.wipe"}}}, []string{"sa-1", "sa-2"})
	if err != nil {
		t.Fatal(err)
	}
	l := func(s, k string) store.Leaf { return store.Leaf{Subject: s, Kind: k} }
	want := []store.Leaf{l("bmc:sa-1/a1", "bmc.boot"), l("bmc:sa-2/a1", "bmc.boot"), l("bmc:sa-1/a1", "bmc.power"), l("bmc:sa-2/a1", "bmc.power"), l("n1", "disk.wipe")}
	if !slices.Equal(leaves, want) {
		t.Fatalf("scope = %v, want %v", leaves, want)
	}
	// Whichever agent a reroute picks, its leaf is listed.
	for _, agent := range []string{"sa-1", "sa-2"} {
		sub := AgentSubject("bmc:a1", agent)
		if !slices.Contains(leaves, store.Leaf{Subject: sub, Kind: "bmc.power"}) {
			t.Errorf("failover to %s: leaf %s not covered", agent, sub)
		}
	}
	// BMC work the ramdisk runs is the node's: one leaf, with no BMC address.
	inband, err := Scope([]Target{{NodeID: "n2", Kinds: []string{"bmc.provisionInband", "bmc.query"}}}, []string{"sa-1", "sa-2"})
	if err != nil || !slices.Equal(inband, []store.Leaf{l("n2", "bmc.provisionInband")}) {
		t.Fatalf("in-band scope = %v %v, want [{n2 bmc.provisionInband}]", inband, err)
	}
	if _, err := Scope([]Target{{NodeID: "n1", Kinds: []string{"bmc.nope"}}}, nil); err == nil {
		t.Fatal("an unknown kind was accepted")
	}
}

func TestChain(t *testing.T) {
	cases := []struct {
		state, target provision.State
		verb          provision.Verb
		want          []provision.State
	}{
		{provision.Enrolling, provision.Ready, provision.VerbEnroll, []provision.State{provision.Enrolling, provision.Inspecting, provision.Commissioning}},
		{provision.Inspecting, provision.Ready, provision.VerbEnroll, []provision.State{provision.Inspecting, provision.Commissioning}},
		{provision.Inspecting, provision.Manageable, provision.VerbInspect, []provision.State{provision.Inspecting}},
		{provision.Commissioning, provision.Ready, provision.VerbProvide, []provision.State{provision.Commissioning}},
		{provision.Releasing, provision.Ready, provision.VerbUndeploy, []provision.State{provision.Releasing}},
		{provision.Retiring, provision.Retired, provision.VerbRetire, []provision.State{provision.Retiring}},
		{provision.Rescue, provision.Rescue, provision.VerbRescue, []provision.State{provision.Rescue}},
		{provision.Manageable, "", provision.VerbManage, nil},
		{provision.Ready, "", "", nil},
	}
	for _, c := range cases {
		if got := Chain(c.state, c.target, c.verb); !slices.Equal(got, c.want) {
			t.Errorf("Chain(%s→%s by %s) = %v, want %v", c.state, c.target, c.verb, got, c.want)
		}
	}
	kinds, err := ChainKinds(Chain(provision.Inspecting, provision.Ready, provision.VerbEnroll), provision.Ready, BuiltinProfileOf(nil), map[string]string{"wipe": "quick"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"bmc.boot", "bmc.power", "disk.wipe", "diag.dcgm", "inventory.refresh"} {
		if !slices.Contains(kinds, k) {
			t.Errorf("inspect→commission chain kinds %v lack %s", kinds, k)
		}
	}
}

// TestPluginSendsMustBeDeclared: a relaying plugin step adds its kind only when the profile
// declares it; otherwise it is outside the scope.
func TestPluginSendsMustBeDeclared(t *testing.T) {
	undeclared := workflow.Profile{Name: "p", Steps: []workflow.Step{{Use: "plugin.httpViaSite"}}}
	declared := workflow.Profile{Name: "p", Steps: []workflow.Step{{Use: "plugin.httpViaSite"}}, Sends: []string{"site.httpProxy"}}
	for _, c := range []struct {
		p    workflow.Profile
		want bool
	}{{undeclared, false}, {declared, true}} {
		kinds, err := ChainKinds([]provision.State{provision.Deploying}, provision.Deployed,
			func(provision.State, provision.State) (workflow.Profile, error) { return c.p, nil }, nil)
		if err != nil {
			t.Fatal(err)
		}
		leaves, _ := Scope([]Target{{NodeID: "n1", Kinds: kinds}}, []string{"sa"})
		got := slices.Contains(leaves, store.Leaf{Subject: "node:n1", Kind: "site.httpProxy"})
		if got != c.want {
			t.Errorf("sends %v: leaf listed %v, want %v", c.p.Sends, got, c.want)
		}
	}
}

func TestGate(t *testing.T) {
	approved := &store.Batch{ID: "b", State: store.BatchApproved, Required: 2}
	running := &store.Batch{ID: "b", State: store.BatchRunning, Required: 2}
	pending := &store.Batch{ID: "b", State: store.BatchPending, Required: 2}
	rejected := &store.Batch{ID: "b", State: store.BatchRejected, Required: 2}
	cases := []struct {
		name      string
		required  int
		b         *store.Batch
		approvals int
		inScope   bool
		ok        bool
	}{
		{"no approvers configured", 0, nil, 0, false, true},
		{"outside any batch", 1, nil, 0, false, false},
		{"pending batch", 2, pending, 1, true, false},
		{"rejected batch", 2, rejected, 2, true, false},
		{"approved, in scope", 2, approved, 2, true, true},
		{"running, in scope", 2, running, 2, true, true},
		{"approved, leaf outside the scope", 2, approved, 2, false, false},
		{"policy raised since approval", 3, approved, 2, true, false},
		{"approved before its deadline", 2, &store.Batch{ID: "b", State: store.BatchApproved, Required: 2, DecidedAt: 999}, 2, true, true},
		{"approved after its deadline", 2, &store.Batch{ID: "b", State: store.BatchApproved, Required: 2, DecidedAt: 1000}, 2, true, false},
	}
	for _, c := range cases {
		err := Gate(c.required, c.b, c.approvals, c.inScope, "n1", "disk.wipe", 1000)
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok=%v", c.name, err, c.ok)
		}
		var re *RefusedError
		if err != nil && !errors.As(err, &re) {
			t.Errorf("%s: %T is not a RefusedError", c.name, err)
		}
	}
}

func TestApproveWithdrawReject(t *testing.T) {
	const later = 1000 // the approval deadline, after "now" (10)
	b := store.Batch{ID: "b", State: store.BatchPending, Required: 2, RequestedBy: "token:ops"}
	// Self-approval refused.
	var self *SelfApprovalError
	if _, err := Approve(b, "token:ops", 0, false, 10, later); !errors.As(err, &self) {
		t.Fatalf("self-approval: %v", err)
	}
	// Quorum of 2: the first approval keeps it pending, the second approves.
	if next, err := Approve(b, "token:a", 0, false, 10, later); err != nil || next != store.BatchPending {
		t.Fatalf("first approval: %s %v", next, err)
	}
	if _, err := Approve(b, "token:a", 1, true, 10, later); err == nil {
		t.Fatal("approving twice was accepted")
	}
	if next, err := Approve(b, "token:b", 1, false, 10, later); err != nil || next != store.BatchApproved {
		t.Fatalf("second approval: %s %v", next, err)
	}
	for _, st := range []string{store.BatchApproved, store.BatchRunning, store.BatchRejected, store.BatchCancelled} {
		bb := b
		bb.State = st
		if _, err := Approve(bb, "token:c", 2, false, 10, later); err == nil {
			t.Errorf("approving a %s batch was accepted", st)
		}
	}
	// Past its approval deadline a pending batch is expired, whether or not the engine has
	// recorded that yet: no approval opens it.
	if _, err := Approve(b, "token:b", 1, false, later, later); err == nil || !strings.Contains(err.Error(), "expired at") {
		t.Fatalf("approving an expired batch: %v", err)
	}
	// Withdrawal: until the batch starts; below the quorum it is pending again.
	ab := b
	ab.State = store.BatchApproved
	if next, err := Withdraw(ab, true, 1); err != nil || next != store.BatchPending || !Rehold(ab.State, next) {
		t.Fatalf("withdraw from approved: %s %v (rehold %v)", next, err, Rehold(ab.State, next))
	}
	if next, err := Withdraw(ab, true, 2); err != nil || next != store.BatchApproved || Rehold(ab.State, next) {
		t.Fatalf("withdraw above the quorum: %s %v", next, err)
	}
	if _, err := Withdraw(b, false, 0); err == nil {
		t.Fatal("withdrawing an approval never given was accepted")
	}
	rb := b
	rb.State = store.BatchRunning
	if _, err := Withdraw(rb, true, 1); err == nil {
		t.Fatal("withdrawing from a running batch was accepted")
	}
	cb := b
	cb.State = store.BatchCancelled
	if _, err := Withdraw(cb, true, 1); err == nil {
		t.Fatal("withdrawing from a cancelled batch was accepted")
	}
	// Rejection: until the batch starts.
	for st, ok := range map[string]bool{store.BatchPending: true, store.BatchApproved: true, store.BatchRunning: false, store.BatchRejected: false, store.BatchCancelled: false} {
		bb := b
		bb.State = st
		if err := Reject(bb); (err == nil) != ok {
			t.Errorf("reject %s: %v, want ok=%v", st, err, ok)
		}
	}
}

func TestRejectedReturn(t *testing.T) {
	for _, s := range provision.States() {
		back, ok := RejectedReturn(s)
		want := s == provision.Manageable || s == provision.Ready || s == provision.Deployed || s == provision.Rescue
		if ok != want || ok && back != s {
			t.Errorf("RejectedReturn(%s) = %s, %v", s, back, ok)
		}
	}
	if _, ok := RejectedReturn(""); ok {
		t.Error("a chain begun at enroll has no state to return to")
	}
}
