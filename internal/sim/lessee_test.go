package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/gateway"
	"bcd/internal/metal"
	"bcd/internal/pki"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// deployedByHand deploys one node with the simulated site, stops the harness, and returns an
// engine driven by hand with one site agent connected.
func deployedByHand(t *testing.T, cfg engine.Config) (*store.Store, *Harness, store.Node, *engine.Engine, engine.Agent) {
	t.Helper()
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"}); err != nil {
		t.Fatal(err)
	}
	n := rest(t, h, ids)[ids[0]]
	if n.State != "deployed" {
		t.Fatalf("deploy: %s %s", n.State, n.FaultMsg)
	}
	h.Stop()
	eng := engine.New(st, nil, nil2(), cfg)
	site := engine.Agent{ID: "agent-a", Kind: "site", SiteID: h.SiteID, ConnID: "c1"}
	if err := eng.Connected(ctx, site, "t"); err != nil {
		t.Fatal(err)
	}
	return st, h, n, eng, site
}

// A lessee's installed OS (a node-tenant certificate) that names a watermark ahead of the store
// is no witness of a restore: only site agents are. Were it one, a lessee could stop every
// server sending commands until an operator ran the restore fence.
func TestLesseeCannotStopTheControlPlane(t *testing.T) {
	ctx := context.Background()
	cfg := engine.Config{AgentGrace: time.Minute, PeerTimeout: time.Minute}
	st, h, n, eng, site := deployedByHand(t, cfg)
	if err := eng.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	told, ok := eng.Watermark() // what the OS's heartbeat acks carry
	if !ok {
		t.Fatal("no watermark")
	}
	osRef := gateway.AgentRef{Kind: pki.KindNodeTenant, NodeID: n.ID, Generation: n.IdentityGeneration}
	forged := gateway.Watermark{StoreID: told.StoreID, Fences: told.Fences, Beats: told.Beats + 1000}
	err := eng.Gateway().Connected(ctx, osRef, gateway.Hello{AgentVersion: "bcd-os", Capabilities: []string{engine.RoleOS}, StoreWatermark: forged})
	if err != nil {
		t.Fatalf("the lessee's OS was refused for its watermark: %v", err)
	}

	// An operator powers the node (any node of any tenant would do): the site agent gets nothing.
	power(t, h, n.ID, "on")
	got, err := eng.Claim(ctx, site, 10)
	if err != nil {
		t.Fatal(err)
	}
	w, witnessed, _ := st.RestoreWitnessed(ctx)
	if len(got) == 0 || witnessed {
		t.Fatalf("a node-tenant (lessee) identity halted the control plane: site agent claimed %d commands, restore witnessed=%v by %q", len(got), witnessed, w.AgentID)
	}
}

// A lessee's OS agent that acknowledges made-up command ids is refused, and its ids are not
// recorded as control_plane.unknown_command (evidence of a restore): only site agents' are.
func TestLesseeUnknownCommandsNotRecorded(t *testing.T) {
	ctx := context.Background()
	st, _, n, eng, _ := deployedByHand(t, engine.Config{AgentGrace: time.Minute, PeerTimeout: time.Minute})
	osRef := gateway.AgentRef{Kind: pki.KindNodeTenant, NodeID: n.ID, Generation: n.IdentityGeneration}
	before := countEvents(t, st, "control_plane.unknown_command")
	for i := 0; i < 20; i++ {
		ids := make([]string, 64)
		for j := range ids {
			ids[j] = fmt.Sprintf("019a0000-0000-7000-8000-%012d", i*64+j)
		}
		if _, err := eng.Gateway().AckAll(ctx, osRef, ids); err != nil {
			t.Fatal(err)
		}
	}
	after := countEvents(t, st, "control_plane.unknown_command")
	if after > before {
		t.Fatalf("a lessee's OS agent wrote %d control_plane.unknown_command events (each telling the operator the store was restored from a backup) with made-up ids", after-before)
	}
}

func countEvents(t *testing.T, st *store.Store, kind string) int {
	t.Helper()
	evs, err := st.Events(context.Background(), store.EventFilter{Limit: 100000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// await.rejoin counts only OS connections made after the site agent took the fallback power
// cycle: an OS that joined between the cycle's queuing and its run (a slow kexec's) was reset by
// it, and its stream is dead until the gateway's idle timeout. Counted, the node would rest
// deployed on a connection from before the reset while the rebooted OS could not join again.
func TestRejoinNotCountedFromBeforeTheFallbackCycle(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	node := ids[0]
	h.Sim.SetFaults(Faults{Hang: map[string]bool{"boot.kexec": true}}) // the ramdisk takes it and says nothing
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"}); err != nil {
		t.Fatal(err)
	}
	var kexec store.Command
	waitFor(t, "boot.kexec taken", func() bool {
		cmds, _ := st.Commands(ctx, node, 500)
		for _, c := range cmds {
			if c.Kind == "boot.kexec" && c.State != "queued" {
				kexec = c
				return true
			}
		}
		return false
	})
	h.Stop() // from here by hand
	n, _ := st.Node(ctx, node, "")
	eng := engine.New(st, nil, nil2(), engine.Config{AgentGrace: time.Minute})
	ramdisk := engine.Agent{ID: kexec.TargetAgent, Kind: "node", NodeID: node, Generation: n.IdentityGeneration, ConnID: "r1"}
	site := engine.Agent{ID: "agent-a", Kind: "site", SiteID: h.SiteID, ConnID: "c1"}
	for _, a := range []engine.Agent{ramdisk, site} {
		if err := eng.Connected(ctx, a, "t"); err != nil {
			t.Fatal(err)
		}
	}
	// kexec_file_load failed: kexecOnce falls back to a BMC power cycle (queued now, epoch = now).
	if err := eng.Report(ctx, ramdisk, engine.Update{CommandID: kexec.ID, State: "failed", Error: "kexec_file_load: operation not permitted"}); err != nil {
		t.Fatal(err)
	}
	eng.RunOnce(ctx)
	wf := openWorkflow(t, st, node)
	cycle, err := st.Command(ctx, wf.CurrentCommand)
	if err != nil || cycle.Kind != "bmc.power" || cycle.State != "queued" {
		t.Fatalf("want the fallback cycle queued: %+v %v", cycle, err)
	}
	time.Sleep(2 * time.Millisecond)
	// The OS comes up (say the ramdisk's own firmware reboot went through after all) and joins,
	// before the site agent has run the cycle.
	osAgent := engine.Agent{ID: "os:" + node, Kind: "os", NodeID: node, Generation: n.IdentityGeneration, ConnID: "os1"}
	if err := eng.Connected(ctx, osAgent, "bcd-os"); err != nil {
		t.Fatal(err)
	}
	// The site agent cycles the machine: the OS's stream is dead, the gateway has not noticed
	// (no Disconnected until IdleTimeout, 45 s).
	got, err := eng.Claim(ctx, site, 10)
	if err != nil || len(got) != 1 || got[0].ID != cycle.ID {
		t.Fatalf("claim: %v %v", got, err)
	}
	if err := eng.Ack(ctx, site, cycle.ID); err != nil {
		t.Fatal(err)
	}
	res, _ := json.Marshal(map[string]string{"power": "on"})
	if err := eng.Report(ctx, site, engine.Update{CommandID: cycle.ID, State: "succeeded", Result: res}); err != nil {
		t.Fatal(err)
	}
	eng.RunOnce(ctx)
	// The site agent runs the cleanup (boot.cleanUp removes the instance's metadata).
	if more, _ := eng.Claim(ctx, site, 10); len(more) == 1 {
		eng.Ack(ctx, site, more[0].ID)
		eng.Report(ctx, site, engine.Update{CommandID: more[0].ID, State: "succeeded", Result: []byte("{}")})
		t.Logf("site ran %s", more[0].Kind)
	}
	eng.RunOnce(ctx)
	n, _ = st.Node(ctx, node, "")
	t.Logf("after the cycle: node %s", n.State)
	if n.State == "deployed" {
		t.Fatalf("await.rejoin was satisfied by an OS connection made before the power cycle reset the machine: node %s", n.State)
	}
}

// Rescue revokes the lease's identity first: a node certificate of the deploy's generation (the
// deploy ramdisk's key, which the kexec left in the lessee's memory) connected as the node's
// "ramdisk" from the running OS cannot stand in for the rescue ramdisk, so the rescue boots its
// own (a boot entry and a power cycle) instead of resting in rescue with the lessee's OS running.
func TestRescueIsNotFakedByALessee(t *testing.T) {
	ctx := context.Background()
	st, h, n, eng, _ := deployedByHand(t, engine.Config{AgentGrace: time.Minute})
	if n.Power != "on" {
		t.Fatalf("power %s", n.Power)
	}
	time.Sleep(2 * time.Millisecond)
	fake := engine.Agent{ID: "node:" + n.ID, Kind: "node", NodeID: n.ID, Generation: n.IdentityGeneration, ConnID: "lessee"}
	if err := eng.Connected(ctx, fake, "bcd-ramdisk"); err != nil {
		t.Fatal(err)
	}
	before, _ := st.Commands(ctx, n.ID, 1000)
	if err := h.Apply(ctx, provision.VerbRescue, []string{n.ID}, metal.VerbInput{}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := eng.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	after, _ := st.Commands(ctx, n.ID, 1000)
	got, _ := st.Node(ctx, n.ID, "")
	wf := openWorkflow(t, st, n.ID)
	t.Logf("node %s target %q, workflow %s %s, %d new commands", got.State, got.TargetState, wf.Profile, wf.State, len(after)-len(before))
	if len(after) == len(before) {
		t.Fatalf("rescue ran no command at all (no boot entry, no power cycle): a connection from the lessee's OS with the lease's node certificate stood in for the rescue ramdisk")
	}
}
