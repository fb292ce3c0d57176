package server_test

import (
	"strings"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/server"
	"bcd/internal/sim"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestAgentDeathOverTheGateway takes nodes through their life with the simulated agents on the
// wire (agentlink over mTLS) while they die holding commands: the site agent at each of the
// three points (as a frame arrives, after its ack was recorded and before running, after
// running), restarting from its journal; ramdisks crashing with their machine left on. Every
// node ends ready, or failed in maintenance with its fault; no command runs twice.
func TestAgentDeathOverTheGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a server and 12 simulated machines over the gateway")
	}
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) { agentDeathOverTheGateway(t, storetest.DSN(t, e)) })
	}
}

func agentDeathOverTheGateway(t *testing.T, dsn string) {
	dir := t.TempDir()
	srv, ctx := serve(t, server.Config{DataDir: dir, StoreDSN: dsn, Engine: engine.Config{AgentGrace: time.Second}}, testLog(t))
	faults := sim.Faults{
		// The site agent dies as the first power cycle arrives, after acknowledging the
		// first two power-offs, and after running the first two queries; a ramdisk crashes
		// after acknowledging a wipe.
		DieOnClaim: map[string]int{"bmc.power:cycle": 1},
		DieBefore:  map[string]int{"bmc.power:off": 2, "disk.wipe": 1},
		DieAfter:   map[string]int{"bmc.query": 2},
	}
	h, err := sim.StartOnServer(ctx, srv, sim.Config{Seed: 3, Faults: faults}, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	const n = 12
	rep, err := h.RunPhases(ctx, n, 2*time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.RanTwice != 0 {
		t.Errorf("%d commands ran twice", rep.RanTwice)
	}
	// Every death asked for happened; commands that kill the site agent may arrive together and
	// end one life, counted once.
	if p := h.Sim.DeathsPending(); p != 0 || rep.SiteAgentDeaths < 1 || rep.RamdiskDeaths != 1 {
		t.Errorf("%d deaths did not happen; %d site agent and %d ramdisk deaths, want at least 1 and 1", p, rep.SiteAgentDeaths, rep.RamdiskDeaths)
	}
	st := srv.Service().Store()
	nodes, err := st.Nodes(ctx, store.NodeFilter{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	failed, unsettled := sim.Settled(nodes)
	for _, u := range unsettled {
		t.Errorf("%s: want ready, or failed in maintenance with its fault", u)
	}
	for _, nd := range nodes {
		if nd.State == "failed" {
			t.Logf("node %s failed: %s: %s", nd.Name, nd.FaultCode, nd.FaultMsg)
		}
	}
	if sum := rep.Phases[0].Failed + rep.Phases[1].Failed + rep.Phases[2].Failed; failed != sum {
		t.Errorf("%d failed; the phases counted %d", failed, sum)
	}
	// The restarted site agent reported what it held as interrupted, which the engine recorded
	// as lost: never run again.
	cmds, err := st.Commands(ctx, "", 100_000)
	if err != nil {
		t.Fatal(err)
	}
	runs := h.Sim.Executions()
	interrupted := 0
	for _, c := range cmds {
		if c.State == "lost" && strings.Contains(c.Error, "interrupted") {
			interrupted++
			if runs := runs[c.ID]; runs > 1 {
				t.Errorf("interrupted %s ran %d times", c.ID, runs)
			}
		}
	}
	if interrupted == 0 {
		t.Error("no command was reported interrupted by the restarted site agent")
	}
	t.Logf("%d interrupted commands, %d lost; phases failed %d/%d/%d", interrupted, rep.Lost, rep.Phases[0].Failed, rep.Phases[1].Failed, rep.Phases[2].Failed)
}
