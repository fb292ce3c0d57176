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
	storetest.Each(t, func(t *testing.T, st *store.Store) {
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
	})
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
