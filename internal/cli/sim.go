package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"bcd/internal/engine"
	"bcd/internal/memnet"
	"bcd/internal/metal"
	"bcd/internal/openfiles"
	"bcd/internal/server"
	"bcd/internal/sim"
	"bcd/internal/store"
)

func simCmd(g *globals) *cobra.Command {
	var nodes int
	var storeDSN string
	var asJSON bool
	var cfg sim.Config
	var timeout time.Duration
	var workers, replicas int
	var grace time.Duration
	var overGateway, writerCPU bool
	var profile, allocsPath, tracePath string
	var bulk, site, budget string
	var approvals int
	cmd := &cobra.Command{
		Use:   "sim [--nodes 1000] [--store DSN | --server URL] [--json]",
		Short: "Simulate N machines (control plane in this process, or --server) and measure each lifecycle phase",
		Long: "Runs the store, node service and engine in this process with a simulated site agent, BMCs and " +
			"ramdisks that use the same calls as the agent gateway, then takes every node through " +
			"enroll → ready, deploy → deployed and undeploy → ready (attested wipe). With --server (and --token, an admin " +
			"token) the simulated site agent and ramdisks join that running server through its agent gateway instead, " +
			"the enrolments and verbs go through its API, and the server's resident memory is read from its /metrics.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if err := checkSim(nodes, cfg, timeout, workers, approvals); err != nil {
				return err
			}
			mem, err := startMemoryBudget(g, budget, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				return err
			}
			defer mem.Stop()
			stop, err := startCPUProfile(profile)
			if err != nil {
				return err
			}
			defer stop()
			stopAllocs, err := startAllocsProfile(allocsPath, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			defer stopAllocs()
			stopTrace, err := startTrace(tracePath)
			if err != nil {
				return err
			}
			defer stopTrace()
			remote := cmd.Flag("server").Changed
			if storeDSN == "" && !remote {
				dir, err := os.MkdirTemp("", "bcd-sim-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				storeDSN = "sqlite:" + filepath.Join(dir, "bcd.db")
			}
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			if remote {
				// Each machine's agent holds its connection open in this process: sim.OpenFiles.
				// (With --gateway they are in memory.)
				if _, err := openfiles.Ensure(ctx, quiet, sim.OpenFiles(nodes)); err != nil {
					return fmt.Errorf("simulating %d machines whose agents speak the agent protocol: %w; simulate fewer machines, or raise the limit (ulimit -n; above the hard limit, ulimit -Hn, only a process with CAP_SYS_RESOURCE may)", nodes, err)
				}
			}
			var h *sim.Harness
			switch {
			case grace < 0:
				return usagef("--agent-grace %s: accepted is a duration of 0 (the engine's default) or more", grace)
			case replicas < 1 || replicas > 16:
				return usagef("--replicas %d: accepted are 1 to 16 servers", replicas)
			case replicas > 1 && (remote || overGateway || !strings.HasPrefix(storeDSN, "postgres")):
				return usagef("--replicas %d: several servers share a PostgreSQL store, in this process: give --store postgres://… (not --server or --gateway)", replicas)
			case remote && (bulk != "" || storeDSN != "" || overGateway || workers != 0 || grace != 0 || writerCPU):
				return usagef("--server runs the lifecycle against that server: --bulk, --store, --gateway, --workers, --agent-grace and --writer-cpu are for a server this command runs (a running server counts its writer's CPU with its own --writer-cpu)")
			case remote:
				dir, err := os.MkdirTemp("", "bcd-sim-remote-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				var ctl *apiControl
				if h, ctl, err = startRemoteSim(ctx, g, cfg, site, "sim-image", dir); err != nil {
					return fmt.Errorf("preparing %s for the simulation: %w", g.server, err)
				}
				if !asJSON {
					fmt.Fprintf(g.env.Stderr, "run %s: nodes named %s-sim-N, labelled %s=%s\n", ctl.Run(), ctl.Run(), simRunLabel, ctl.Run())
				}
			case overGateway:
				dir, err := os.MkdirTemp("", "bcd-sim-gw-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				// The agents reach the gateway over an in-memory network: TLS and HTTP/2 as over
				// TCP, without the two descriptors a loopback connection takes in this process.
				// (Its address is a loopback port nothing listens on: a connection that went to
				// TCP by mistake would be refused on this machine.)
				gwLn := memnet.Listen("127.0.0.1:1")
				srv, err := server.New(ctx, server.Config{Listen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0", GatewayListener: gwLn,
					DataDir: dir, StoreDSN: storeDSN, Engine: engine.Config{Workers: workers, AgentGrace: grace}, WriterCPU: writerCPU}, quiet)
				if err != nil {
					gwLn.Close()
					return err
				}
				sctx, cancel := context.WithCancel(ctx)
				served := make(chan error, 1)
				go func() { served <- srv.Serve(sctx) }()
				defer func() { cancel(); <-served }()
				cfg.Gateway = &sim.GatewayTarget{Dial: gwLn.DialContext}
				if h, err = sim.StartOnServer(ctx, srv, cfg, dir); err != nil {
					return err
				}
			default:
				var stores []*store.Store
				for range replicas {
					st, err := store.Open(ctx, storeDSN)
					if err != nil {
						return err
					}
					defer st.Close()
					st.MeasureWriterCPU(writerCPU)
					stores = append(stores, st)
				}
				if h, err = sim.StartReplicas(ctx, stores, cfg, engine.Config{Workers: workers, AgentGrace: grace}, quiet); err != nil {
					return err
				}
			}
			defer h.Stop()
			last, lastAt := "", time.Time{}
			show := func(phase string, done, total int) {
				if asJSON || phase == last && done < total && time.Since(lastAt) < time.Second {
					return
				}
				if phase != last && last != "" {
					fmt.Fprintln(g.env.Stderr)
				}
				last, lastAt = phase, time.Now()
				fmt.Fprintf(g.env.Stderr, "\r%-20s %6d/%d", phase, done, total)
			}
			if bulk != "" {
				rep, err := h.RunBulk(ctx, nodes, bulk, approvals, timeout, show)
				if !asJSON {
					fmt.Fprintln(g.env.Stderr)
				}
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(g.env.Stdout).Encode(rep)
				}
				fmt.Fprintf(g.env.Stdout, "%d nodes on %s; %s\n", rep.Nodes, rep.Engine, rep.Enroll)
				fmt.Fprintf(g.env.Stdout, "metal.bulk %s of %d nodes answered in %s (process CPU %s; %d leaves, %d approvals required)\n", rep.Verb, rep.Nodes,
					rep.Answer.Round(time.Millisecond), rep.AnswerCPU.Round(time.Millisecond), rep.Leaves, rep.Required)
				fmt.Fprintf(g.env.Stdout, "approvals answered in %s; %s\n", rep.Approve.Round(time.Millisecond), rep.Rest)
				return nil
			}
			rep, err := h.RunPhases(ctx, nodes, timeout, show)
			if !asJSON {
				fmt.Fprintln(g.env.Stderr)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(g.env.Stdout).Encode(rep)
			}
			fmt.Fprintf(g.env.Stdout, "%d nodes on %s (enroll API calls took %s)\n", rep.Nodes, rep.Engine, rep.EnrollTotal.Round(time.Millisecond))
			for _, p := range rep.Phases {
				fmt.Fprintln(g.env.Stdout, p)
			}
			of := ""
			if rep.RSSOf != "" {
				of = " (" + rep.RSSOf + ")"
			}
			restarts := ""
			switch rep.ServerRestarts {
			case 0:
			case 1:
				restarts = "; the server restarted once during the run"
			default:
				restarts = fmt.Sprintf("; the server restarted %d times during the run", rep.ServerRestarts)
			}
			fmt.Fprintf(g.env.Stdout, "commands: %d, run twice: %d, lost: %d; deaths: %d site agents, %d ramdisks; peak RSS %.0f MiB%s%s\n", rep.Commands, rep.RanTwice, rep.Lost, rep.SiteAgentDeaths, rep.RamdiskDeaths, rep.PeakRSSMiB, of, restarts)
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&nodes, "nodes", 1000, "simulated machines")
	f.StringVar(&bulk, "bulk", "", "instead of the lifecycle: enroll, then one metal.bulk of VERB (retire, inspect, manage, deploy) on every node, approved by --approvals approvers; times the answer and approval → rest")
	f.IntVar(&approvals, "approvals", 1, "with --bulk: approvals the pool requires")
	f.StringVar(&storeDSN, "store", "", "store DSN (default: SQLite in a temporary directory)")
	f.BoolVar(&asJSON, "json", false, "print the figures as JSON")
	f.DurationVar(&cfg.Latency, "latency", 0, "simulated latency of every BMC and ramdisk command")
	f.DurationVar(&cfg.BootDelay, "boot-delay", 0, "simulated power-on → ramdisk joined")
	f.Float64Var(&cfg.Faults.BMCErrorRate, "bmc-error-rate", 0, "fraction of BMC commands that fail")
	f.Float64Var(&cfg.Faults.WipeReadbackFail, "wipe-readback-fail-rate", 0, "fraction of wipes whose read-back fails")
	f.Float64Var(&cfg.Faults.RamdiskDeath, "ramdisk-death-rate", 0, "fraction of commands whose ramdisk crashes holding them (the machine stays on, hung); once the grace period has passed the step starts again on a new ramdisk if it has retries left, else fails")
	f.Float64Var(&cfg.Faults.SiteAgentDeath, "site-agent-death-rate", 0, "fraction of commands whose site agent dies holding them (as it receives them, before running them or after; never reporting). In process a standby agent takes over and the engine's grace period decides what was lost; with --gateway or --server the agent is killed and restarts from its journal, reporting what it had started as interrupted")
	f.DurationVar(&timeout, "timeout", 10*time.Minute, "give up on a phase after this long")
	f.StringVar(&budget, "memory-budget", defaultMemoryBudget, "as bcd server's: memory Go's collector lets this process reach before it collects, while its live heap is small; 0: Go's default collector")
	f.IntVar(&workers, "workers", 0, "reconciler workers (0: the engine's default)")
	f.IntVar(&replicas, "replicas", 1, "servers sharing the store, in this process (PostgreSQL only): the site agent on the first, each machine's agents spread over them")
	f.DurationVar(&grace, "agent-grace", 0, "how long a departed agent may take to reconnect before what it never acknowledged moves to another agent and what it acknowledged is lost (0: the engine's default, 15s)")
	f.StringVar(&profile, "cpuprofile", "", "write a CPU profile of the run to this file")
	f.StringVar(&allocsPath, "allocsprofile", "", "write a profile of the run's heap allocations to this file at its end (go tool pprof -sample_index=alloc_space)")
	f.StringVar(&tracePath, "trace", "", "write a runtime execution trace of the run to this file (go tool trace)")
	f.StringVar(&site, "site", "default", "with --server: the site whose pool \"default\" the simulated machines are enrolled in")
	f.BoolVar(&writerCPU, "writer-cpu", false, "count the CPU time of SQLite's single writer (writerCpuNs), as bcd server's --writer-cpu: locks it to one OS thread, which costs it about 8 % of its throughput")
	f.BoolVar(&overGateway, "gateway", false, "simulated agents speak the real agent protocol (mTLS gateway, join tokens, agentlink) instead of in-process calls")
	return cmd
}

// checkSim refuses what bcd sim cannot run with, in the flags' terms.
func checkSim(nodes int, cfg sim.Config, timeout time.Duration, workers, approvals int) error {
	for _, r := range []struct {
		flag string
		v    float64
	}{{"--bmc-error-rate", cfg.Faults.BMCErrorRate}, {"--wipe-readback-fail-rate", cfg.Faults.WipeReadbackFail},
		{"--ramdisk-death-rate", cfg.Faults.RamdiskDeath}, {"--site-agent-death-rate", cfg.Faults.SiteAgentDeath}} {
		if !(r.v >= 0 && r.v <= 1) { // NaN too
			return usagef("%s %g: accepted are fractions from 0 to 1", r.flag, r.v)
		}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--latency", cfg.Latency}, {"--boot-delay", cfg.BootDelay}} {
		if d.v < 0 {
			return usagef("%s %s: accepted is a duration of 0 or more", d.flag, d.v)
		}
	}
	switch {
	case nodes < 1:
		return usagef("--nodes %d: accepted is 1 or more", nodes)
	case timeout <= 0:
		return usagef("--timeout %s: accepted is a duration above 0", timeout)
	case workers < 0:
		return usagef("--workers %d: accepted is 0 (the engine's default) or more", workers)
	case approvals < 0 || approvals > metal.MaxRequiredApprovals:
		return usagef("--approvals %d: accepted are 0 to %d", approvals, metal.MaxRequiredApprovals)
	}
	return nil
}
