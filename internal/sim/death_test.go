package sim

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

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
		h, id := oneNode(t, st, Config{Faults: Faults{DieAfter: map[string]int{"bmc.power:off": 1}}}, "0s", "lost-done")
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
		h, id := oneNode(t, st, Config{Faults: Faults{DieBefore: map[string]int{"bmc.power:off": 2}}}, "0s", "lost-retry")
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

// TestLifecycleUnderFaults takes nodes through the benchmark's three phases while the site
// agent and ramdisks die holding commands, BMCs fail and wipes do not read back: every node ends ready or
// failed in maintenance with its fault, a failed node leaves the run, no command runs twice,
// and what the dead agents acknowledged is lost.
func TestLifecycleUnderFaults(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, err := Start(ctx, st, Config{Seed: 7, Faults: Faults{SiteAgentDeath: 0.02, RamdiskDeath: 0.01, BMCErrorRate: 0.02, WipeReadbackFail: 0.05}}, engineConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	const n = 30
	rep, err := h.RunPhases(ctx, n, time.Minute, nil)
	if err != nil {
		logUnrested(t, st)
		t.Fatal(err)
	}
	if len(rep.Phases) != 3 {
		t.Fatalf("%d phases, want 3", len(rep.Phases))
	}
	for i, p := range rep.Phases[1:] {
		if prev := rep.Phases[i]; p.Nodes != prev.Nodes-prev.Failed {
			t.Errorf("%s took %d nodes, want the %d that %s did not fail", p.Name, p.Nodes, prev.Nodes-prev.Failed, prev.Name)
		}
	}
	if rep.RanTwice != 0 || rep.SiteAgentDeaths == 0 || rep.Lost == 0 {
		t.Errorf("run twice %d, site agent deaths %d, lost %d: want none run twice, and deaths that lost commands", rep.RanTwice, rep.SiteAgentDeaths, rep.Lost)
	}
	// The engine's count (bcd_commands_lost_total) is the store's.
	if byState, err := st.CountCommandsByState(ctx); err != nil || byState["lost"] != rep.Lost {
		t.Errorf("the store holds %d lost commands (%v), the engine counted %d", byState["lost"], err, rep.Lost)
	}
	nodes, err := st.Nodes(ctx, store.NodeFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	failed, unsettled := Settled(nodes)
	for _, u := range unsettled {
		t.Errorf("%s: want ready, or failed in maintenance with its fault", u)
	}
	if sum := rep.Phases[0].Failed + rep.Phases[1].Failed + rep.Phases[2].Failed; len(nodes) != n || failed != sum {
		t.Errorf("%d nodes, %d failed; the phases counted %d failed", len(nodes), failed, sum)
	}
}

// logUnrested logs the commands and open workflow of every node that is not at rest.
func logUnrested(t *testing.T, st *store.Store) {
	ctx := context.Background()
	nodes, err := st.Nodes(ctx, store.NodeFilter{Limit: 10000})
	if err != nil {
		t.Log(err)
		return
	}
	for _, n := range nodes {
		if n.TargetState == "" {
			continue
		}
		t.Logf("node %s: %s → %s", n.Name, n.State, n.TargetState)
		if wfs, err := st.Workflows(ctx, n.ID, 1); err == nil && len(wfs) > 0 {
			w := wfs[0]
			t.Logf("  workflow %s %s: %s step %d attempt %d, command %s, deadline in %s", w.Profile, w.ID, w.State, w.StepIndex, w.StepAttempt, w.CurrentCommand, time.Until(store.Micros(w.StepDeadline)).Round(time.Second))
		}
		cmds, _ := st.Commands(ctx, n.ID, 1000)
		for _, c := range cmds {
			t.Logf("  %s %s %s on %q (attempts %d) %s", c.ID, c.Kind, c.State, c.TargetAgent, c.Attempts, c.Error)
		}
	}
}

// The site agent power-cycles the node into its ramdisk, then dies before it reports: the
// ramdisk boots and uses its boot entry's one-time token while the cycle is lost. Retried
// alone, the next cycle would boot a ramdisk with no token to join with; it is retried from
// boot.prepareRamdisk, whose new entry the next boot joins with, and the node is ready.
func TestLostPowerCycleIsRetriedWithANewBootEntry(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		h, id := oneNode(t, st, Config{Faults: Faults{DieAfter: map[string]int{"bmc.power:cycle": 1}}}, "0s", "lost-cycle")
		n := rest(t, h, []string{id})[id]
		if n.State != "ready" || n.Maintenance {
			t.Fatalf("node %s, maintenance %v (fault %s: %s), want ready", n.State, n.Maintenance, n.FaultCode, n.FaultMsg)
		}
		cycles, _ := powerCommands(t, st, id, "cycle")
		if len(cycles) != 2 || cycles[0].State != "lost" || h.Sim.Executions()[cycles[0].ID] != 1 || cycles[1].State != "succeeded" {
			t.Fatalf("power cycles %+v: want the lost one (run once), then one that succeeded", cycles)
		}
		cmds, err := st.Commands(context.Background(), id, 1000)
		if err != nil {
			t.Fatal(err)
		}
		prepared := 0
		for _, c := range cmds {
			if c.Kind == "boot.prepareRamdisk" && c.WorkflowID == cycles[0].WorkflowID {
				prepared++
			}
		}
		if prepared != 2 {
			t.Errorf("%d ramdisk boot entries in the lost cycle's workflow, want 2 (one per cycle)", prepared)
		}
		if rs := reasons(t, st, id); !hasReason(rs, "retrying power.cycle{action: cycle} from boot.prepareRamdisk (attempt 2 of 2)") {
			t.Errorf("step events %q: want the retry from boot.prepareRamdisk", rs)
		}
	})
}

// A node's ramdisk crashes holding a command (after acknowledging it, or as the command
// arrives) and its machine stays on, hung. No ramdisk takes a retry as it is: a step with
// retries left (inventory.refresh) starts again from the workflow's boot.prepareRamdisk — a new
// boot entry, a power cycle, a new ramdisk — and the node ends ready; a step without retries
// (disk.wipe) fails once the grace period has passed, not at its deadline. No command the dead
// ramdisk held ever ran.
func TestRamdiskDeath(t *testing.T) {
	// faults are made for each run: a run uses up its deaths.
	cases := []struct {
		name   string
		faults func() Faults
		kind   string
		states []string // of the kind's commands, oldest first
		fault  string   // "": the node ends ready
	}{
		{"acknowledged, retried on a new ramdisk", func() Faults { return Faults{DieBefore: map[string]int{"inventory.refresh": 1}} },
			"inventory.refresh", []string{"lost", "succeeded"}, ""},
		{"not acknowledged, retried on a new ramdisk", func() Faults { return Faults{DieOnClaim: map[string]int{"inventory.refresh": 1}} },
			"inventory.refresh", []string{"failed", "succeeded"}, ""},
		{"acknowledged, no retry", func() Faults { return Faults{DieBefore: map[string]int{"disk.wipe": 1}} },
			"disk.wipe", []string{"lost"}, "disk.wipe lost"},
		{"not acknowledged, no retry", func() Faults { return Faults{DieOnClaim: map[string]int{"disk.wipe": 1}} },
			"disk.wipe", []string{"failed"}, "the node's ramdisk went away before it took disk.wipe"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				h, id := oneNode(t, st, Config{Faults: c.faults()}, "0s", "ramdisk-dies")
				n := rest(t, h, []string{id})[id]
				switch {
				case c.fault == "" && (n.State != "ready" || n.Maintenance):
					t.Fatalf("node %s, fault %s (%s), maintenance %v: want ready", n.State, n.FaultCode, n.FaultMsg, n.Maintenance)
				case c.fault != "" && (n.FaultCode != "STEP_FAILED" || !n.Maintenance || !strings.Contains(n.FaultMsg, c.fault)):
					t.Fatalf("node %s, fault %s (%s), maintenance %v: want failed (%s), in maintenance", n.State, n.FaultCode, n.FaultMsg, n.Maintenance, c.fault)
				}
				if d := h.Sim.RamdiskDeaths(); d != 1 {
					t.Errorf("%d ramdisk deaths, want 1", d)
				}
				cmds, err := st.Commands(context.Background(), id, 1000)
				if err != nil {
					t.Fatal(err)
				}
				var states []string
				for _, cmd := range cmds {
					if cmd.Kind != c.kind {
						continue
					}
					states = append(states, cmd.State)
					if runs, want := h.Sim.Executions()[cmd.ID], map[bool]int{true: 1}[cmd.State == "succeeded"]; runs != want {
						t.Errorf("%s %s (%s) ran %d times, want %d", c.kind, cmd.ID, cmd.State, runs, want)
					}
				}
				if !slices.Equal(states, c.states) {
					t.Errorf("%s commands %v, want %v", c.kind, states, c.states)
				}
				if c.fault == "" && !hasReason(reasons(t, st, id), "retrying inventory.refresh from boot.prepareRamdisk") {
					t.Errorf("step events %q: want the retry from boot.prepareRamdisk", reasons(t, st, id))
				}
			})
		})
	}
}

// The site agent dies as a BMC credential rotation's bmc.rotate arrives, before acknowledging
// it: the command never ran, so once the grace period has passed it moves to the standby, which
// rotates the password once, instead of the rotation waiting for its deadline.
func TestUnacknowledgedRotationMovesToTheStandby(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		h, id := oneNode(t, st, Config{}, "0s", "rotate-moves")
		rest(t, h, []string{id})
		h.Sim.SetFaults(Faults{DieOnClaim: map[string]int{"bmc.rotate": 1}})
		res, err := h.Metal.RotateBmcCredential(ctx, h.Admin, id, "after a leak")
		if err != nil {
			t.Fatal(err)
		}
		var vs []store.CredentialVersion
		waitFor(t, "the rotation's outcome", func() bool {
			vs, _ = st.CredentialVersions(ctx, id)
			return len(vs) == 2 && vs[0].State != store.CredPending
		})
		cmd, err := st.Command(ctx, res.CommandID)
		if err != nil {
			t.Fatal(err)
		}
		if vs[0].State != store.CredCurrent || cmd.State != "succeeded" || cmd.TargetAgent != "sim-site-1.1" {
			t.Fatalf("rotation %s (%s), command %s on %s: want current, run by the standby", vs[0].State, vs[0].Error, cmd.State, cmd.TargetAgent)
		}
		if d, runs := h.Sim.SiteAgentDeaths(), h.Sim.Executions()[cmd.ID]; d != 1 || runs != 1 {
			t.Errorf("%d site agent deaths, bmc.rotate ran %d times; want 1 and 1", d, runs)
		}
	})
}
