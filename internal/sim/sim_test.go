package sim

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

func states(m map[string]store.Node) map[string]int {
	out := map[string]int{}
	for _, n := range m {
		out[n.State]++
	}
	return out
}

func TestLifecycle(t *testing.T) {
	storetest.Each(t, lifecycle)
}

// The same life with every group of writes run twice (SQLite's writer rolls the first run back),
// as a group is when a write of it fails: a write function that keeps something in memory
// beside its writes, without undoing it (Tx.OnUndo), shows here as a machine that never gets
// its command, a command run twice or a node stuck.
func TestLifecycleWithEveryWriteRunTwice(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		if st.Engine() != store.SQLite {
			t.Skip("the rehearsal is SQLite's writer's")
		}
		st.RehearseWrites(true)
		defer st.RehearseWrites(false)
		lifecycle(t, st)
	})
}

func lifecycle(t *testing.T, st *store.Store) {
	ctx := context.Background()
	h, err := Start(ctx, st, Config{}, engine.Config{Poll: 20 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	ids, err := h.Enroll(ctx, "n", 6)
	if err != nil {
		t.Fatal(err)
	}
	got, err := h.WaitRest(ctx, ids, 60*time.Second)
	if err != nil {
		dumpStuck(t, st, got)
		t.Fatal(err, states(got))
	}
	if s := states(got); s["ready"] != 6 {
		for _, n := range got {
			if n.State != "ready" {
				t.Logf("%s: %s %s %s", n.Name, n.State, n.FaultCode, n.FaultMsg)
			}
		}
		t.Fatalf("after enroll: %v", s)
	}
	for _, id := range ids {
		if m := h.Sim.Machine(id); m.Disk != "wiped" || m.power {
			t.Errorf("commissioned machine %s: disk %s, power %v (want wiped, off)", id, m.Disk, m.power)
		}
	}
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "debian-12"}); err != nil {
		t.Fatal(err)
	}
	if got, err = h.WaitRest(ctx, ids, 60*time.Second); err != nil || states(got)["deployed"] != 6 {
		t.Fatalf("after deploy: %v %v", states(got), err)
	}
	// Rescue and unrescue one node.
	if err := h.Apply(ctx, provision.VerbRescue, ids[:1], metal.VerbInput{}); err != nil {
		t.Fatal(err)
	}
	if got, err := h.WaitRest(ctx, ids[:1], 30*time.Second); err != nil || got[ids[0]].State != "rescue" {
		t.Fatalf("rescue: %v %v", states(got), err)
	}
	if err := h.Apply(ctx, provision.VerbUnrescue, ids[:1], metal.VerbInput{}); err != nil {
		t.Fatal(err)
	}
	if got, err := h.WaitRest(ctx, ids[:1], 30*time.Second); err != nil || got[ids[0]].State != "deployed" {
		t.Fatalf("unrescue: %v %v %+v", states(got), err, got[ids[0]])
	}
	if err := h.Apply(ctx, provision.VerbUndeploy, ids, metal.VerbInput{Wipe: "full"}); err != nil {
		t.Fatal(err)
	}
	if got, err = h.WaitRest(ctx, ids, 60*time.Second); err != nil || states(got)["ready"] != 6 {
		t.Fatalf("after undeploy: %v %v", states(got), err)
	}
	for id, n := range h.Sim.Executions() {
		if n != 1 {
			t.Errorf("command %s ran %d times", id, n)
		}
	}
	evs, _ := st.Events(ctx, store.EventFilter{NodeID: ids[1], Limit: 1000})
	var path []string
	for _, e := range evs {
		if e.FromState != e.ToState {
			path = append(path, e.ToState)
		}
	}
	if got, want := strings.Join(path, " "), "enrolling inspecting commissioning ready deploying deployed releasing ready"; got != want {
		t.Errorf("state path of a node:\n got %s\nwant %s", got, want)
	}
}

func dumpStuck(t *testing.T, st *store.Store, nodes map[string]store.Node) {
	ctx := context.Background()
	for id, n := range nodes {
		if n.TargetState == "" {
			continue
		}
		wfs, _ := st.Workflows(ctx, id, 1)
		for _, w := range wfs {
			t.Logf("%s %s: wf %s %s phase %s step %d attempt %d cmd %s deadline-in %dms fault %s %s", n.Name, n.State, w.Profile, w.State, w.Phase, w.StepIndex, w.StepAttempt, w.CurrentCommand, (w.StepDeadline-time.Now().UnixMicro())/1000, w.FaultCode, w.Error)
		}
		cmds, _ := st.Commands(ctx, id, 100)
		for _, c := range cmds {
			t.Logf("   cmd %s %s %s agent=%s args=%s", c.ID[len(c.ID)-6:], c.Kind, c.State, c.TargetAgent, c.Args)
		}
	}
	w, _ := st.WakeUps(ctx, 100)
	t.Logf("wake-ups: %+v", w)
}

func nil2() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestLifecycleOnThreeServers: three engines on one PostgreSQL store, with the machines' agents
// spread over them, take 24 machines through their life with faults injected (BMC errors, a
// wipe that does not read back, and agent deaths): every machine ends where it should or
// failed with its fault, each server did part of the work, and no command ran twice.
func TestLifecycleOnThreeServers(t *testing.T) {
	ctx := context.Background()
	dsn := storetest.DSN(t, store.Postgres)
	var stores []*store.Store
	for range 3 {
		st, err := store.Open(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		stores = append(stores, st)
	}
	cfg := Config{Faults: Faults{BMCErrorRate: 0.02, WipeReadbackFail: 0.02, RamdiskDeath: 0.01, SiteAgentDeath: 0.005}}
	h, err := StartReplicas(ctx, stores, cfg, engine.Config{Poll: 20 * time.Millisecond, AgentGrace: 300 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	const n = 24
	ids, err := h.Enroll(ctx, "r", n)
	if err != nil {
		t.Fatal(err)
	}
	settled := func(phase, want string) (arrived []string) {
		t.Helper()
		got, err := h.WaitRest(ctx, ids, 90*time.Second)
		if err != nil {
			dumpStuck(t, stores[0], got)
			t.Fatalf("%s: %v %v", phase, err, states(got))
		}
		for id, nd := range got {
			switch {
			case nd.State == want:
				arrived = append(arrived, id)
			case nd.State != "failed" || nd.FaultCode == "" || !nd.Maintenance:
				t.Errorf("%s: %s is %s (fault %q)", phase, nd.Name, nd.State, nd.FaultCode)
			}
		}
		t.Logf("%s: %v", phase, states(got))
		return arrived
	}
	ids = settled("enroll", "ready")
	if len(ids) < n/2 {
		t.Fatalf("only %d of %d machines got ready", len(ids), n)
	}
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "debian-12"}); err != nil {
		t.Fatal(err)
	}
	settled("deploy", "deployed")
	for id, c := range h.Sim.Executions() {
		if c != 1 {
			t.Errorf("command %s ran %d times", id, c)
		}
	}
	for i, e := range h.engines {
		if e.Reconciliations() == 0 {
			t.Errorf("server %d reconciled nothing", i)
		}
	}
}

// The simulated ramdisks connect as the gateway names a node's ramdisk (engine.NodeAgentID), one
// agent per node whatever the boot, with the certificate they joined with: the engine recorded
// the key of each node's last ramdisk (Tx.NodeAgentBoot), so another key is taken for another
// boot, as over the gateway. Named per boot, or without a certificate, no such agent or key is
// there.
func TestSimulatedRamdisksAreTheGatewaysNodeAgents(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, ids := start(t, st, 3)
		if got := rest(t, h, ids); states(got)["ready"] != len(ids) {
			t.Fatalf("after enroll: %v", states(got))
		}
		for _, id := range ids {
			var rebooted bool
			err := st.Write(ctx, func(tx *store.Tx) error {
				var err error
				rebooted, err = tx.NodeAgentBoot(ctx, engine.NodeAgentID("node", id), "another key")
				return err
			})
			if err != nil || !rebooted {
				t.Errorf("node %s: the ramdisk agent %s with a key recorded: another key is another boot %v, %v; want true",
					id, engine.NodeAgentID("node", id), rebooted, err)
			}
		}
	})
}
