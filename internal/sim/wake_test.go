package sim

import (
	"context"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A verb that queues a wake-up nudges the harness's reconcilers, as bcd server's metal service
// nudges its engine: with a reconciler that would otherwise look only once an hour, an
// enrolment and then a deployment made through the node service alone (not the harness's
// Enroll and Apply, which nudge when they are done) each carry the machine to rest.
func TestVerbsNudgeTheReconcilers(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	// Nothing else makes the reconcilers look: no poll, and the heartbeat and the departed
	// agents' reaping (PeerTimeout/6, AgentGrace/3) an hour away too.
	h, err := Start(ctx, st, Config{}, engine.Config{Poll: time.Hour, AgentGrace: 3 * time.Hour, PeerTimeout: 6 * time.Hour}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	const mac, uuid = "02:77:00:00:00:01", "00000001-0077-4000-8000-000000000001"
	node, err := h.Metal.Enroll(ctx, h.Admin, metal.EnrollInput{Name: "woken", Pool: "default", MACs: []string{mac}, ProductUUID: uuid,
		BMC: metal.BMCInput{Address: "https://10.9.0.1", Username: "admin", Password: "sim-password"}})
	if err != nil {
		t.Fatal(err)
	}
	h.Sim.Add(&Machine{NodeID: node.ID, UUID: uuid, MACs: []string{mac}})
	waitState(t, h, node.ID, "ready")
	if _, _, err := h.Metal.Apply(ctx, h.Admin, provision.VerbDeploy, metal.VerbInput{Node: node.ID, Image: "img"}); err != nil {
		t.Fatal(err)
	}
	waitState(t, h, node.ID, "deployed")
}

// waitState waits until the node rests (Harness.WaitRest) for at most 20 s, before the
// reconcilers' sweep for stranded nodes (every 30 s) would find it, and wants it in want.
func waitState(t *testing.T, h *Harness, id, want string) {
	t.Helper()
	got, err := h.WaitRest(context.Background(), []string{id}, 20*time.Second)
	if err != nil {
		t.Fatalf("%v, want it %s: no reconciler was woken", err, want)
	}
	if n := got[id]; n.State != want {
		t.Fatalf("node rests in %s, want %s", n.State, want)
	}
}
