package sim

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// powerCommands lists the node's bmc.power commands with the given action, and its bmc.query
// commands for power, oldest first.
func powerCommands(t *testing.T, st *store.Store, nodeID, action string) (power, queries []store.Command) {
	t.Helper()
	cmds, err := st.Commands(context.Background(), nodeID, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		var args struct{ Action, Query string }
		_ = json.Unmarshal([]byte(c.Args), &args)
		switch {
		case c.Kind == "bmc.power" && args.Action == action:
			power = append(power, c)
		case c.Kind == "bmc.query" && args.Query == "power":
			queries = append(queries, c)
		}
	}
	return power, queries
}

// reasons returns the reasons of the node's workflow.step events.
func reasons(t *testing.T, st *store.Store, nodeID string) []string {
	t.Helper()
	evs, err := st.Events(context.Background(), store.EventFilter{NodeID: nodeID, Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs {
		if e.Kind == "workflow.step" && e.Reason != "" {
			out = append(out, e.Reason)
		}
	}
	return out
}

func hasReason(rs []string, s string) bool {
	for _, r := range rs {
		if strings.Contains(r, s) {
			return true
		}
	}
	return false
}

// The site agent powers the node off at the end of commissioning, then dies before it reports:
// the command is lost and never sent again; a standby agent's power query shows the node off,
// so the step is done without a second power action and the node is ready.
func TestLostPowerOffThatTookEffect(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		h, id := oneNode(t, st, Config{Faults: Faults{DieAfter: map[string]bool{"bmc.power:off": true}}}, "0s", "lost-done")
		n := rest(t, h, []string{id})[id]
		if n.State != "ready" || n.Maintenance || n.Power != "off" {
			t.Fatalf("node %s, maintenance %v, power %s (fault %s: %s), want ready and off", n.State, n.Maintenance, n.Power, n.FaultCode, n.FaultMsg)
		}
		if d := h.Sim.SiteAgentDeaths(); d != 1 {
			t.Errorf("%d site agent deaths, want 1", d)
		}
		offs, queries := powerCommands(t, st, id, "off")
		execs := h.Sim.Executions()
		if len(offs) != 1 || offs[0].State != "lost" || offs[0].TargetAgent != "sim-site-1" || execs[offs[0].ID] != 1 {
			t.Fatalf("power off commands %+v: want one, run once by sim-site-1 and lost (never sent again)", offs)
		}
		last := queries[len(queries)-1]
		if last.State != "succeeded" || last.TargetAgent != "sim-site-1.1" || last.CreatedAt < offs[0].CreatedAt {
			t.Errorf("the last power query: %s by %s, want succeeded by the standby after the lost power off", last.State, last.TargetAgent)
		}
		rs := reasons(t, st, id)
		if !hasReason(rs, "bmc.power lost: its agent went away after acknowledging it; querying power") || !hasReason(rs, "bmc.power was lost but took effect: power is off") {
			t.Errorf("step events %q: want the loss and its settlement", rs)
		}
		for cid, k := range execs {
			if k > 1 {
				t.Errorf("command %s ran %d times", cid, k)
			}
		}
	})
}

// The site agent dies before it runs each power off: the power query shows the node still on,
// so the step is retried with a new command (power.off allows one retry); that one is lost the
// same way and the node fails with the step, in maintenance. No lost command ever ran.
func TestLostPowerOffThatDidNot(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		h, id := oneNode(t, st, Config{Faults: Faults{DieBefore: map[string]bool{"bmc.power:off": true}}}, "0s", "lost-retry")
		n := rest(t, h, []string{id})[id]
		if n.FaultCode != "STEP_FAILED" || !n.Maintenance || !strings.Contains(n.FaultMsg, "bmc.power was lost and did not take effect: power is on, not off") {
			t.Fatalf("node %s, fault %s (%s), maintenance %v: want failed by the step, in maintenance", n.State, n.FaultCode, n.FaultMsg, n.Maintenance)
		}
		offs, _ := powerCommands(t, st, id, "off")
		execs := h.Sim.Executions()
		if len(offs) != 2 {
			t.Fatalf("%d power off commands, want 2 (the step and its one retry)", len(offs))
		}
		for _, c := range offs {
			if c.State != "lost" || execs[c.ID] != 0 {
				t.Errorf("power off %s: %s, ran %d times; want lost, never run", c.ID, c.State, execs[c.ID])
			}
		}
		if offs[0].TargetAgent == offs[1].TargetAgent {
			t.Errorf("both attempts went to %s: the retry must go to the agent that took over", offs[0].TargetAgent)
		}
		if d := h.Sim.SiteAgentDeaths(); d != 2 {
			t.Errorf("%d site agent deaths, want 2", d)
		}
		if !h.Sim.Machine(id).Powered() {
			t.Error("the machine is off: no power off ran")
		}
	})
}
