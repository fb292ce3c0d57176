package sim

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"bcd/internal/auth"
	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// Phase is one measured phase over every node.
type Phase struct {
	Name        string        `json:"name"`
	Nodes       int           `json:"nodes"`
	Total       time.Duration `json:"totalNs"`
	NodesPerSec float64       `json:"nodesPerSec"`
	P50         time.Duration `json:"p50Ns"`
	P99         time.Duration `json:"p99Ns"`
	Failed      int           `json:"failed"`
	// Faults counts the failed nodes by their fault code (provision.Faults).
	Faults map[string]int `json:"faults,omitempty"`
	// CPU is the process's CPU time during the phase (the simulated agents' included);
	// WriterBusy the part of the phase SQLite's single writer was at work (0 on PostgreSQL),
	// and WriterCPU the CPU time its thread used meanwhile (busy, less the time it waited for a
	// core: the figure that varies least between runs on a shared machine), counted only with
	// --writer-cpu (store.MeasureWriterCPU), else 0 and left out.
	CPU        time.Duration `json:"cpuNs"`
	WriterBusy time.Duration `json:"writerBusyNs"`
	WriterCPU  time.Duration `json:"writerCpuNs,omitempty"`
	// GCCPU is the Go runtime's estimate of the CPU time its garbage collector took during the
	// phase (a part of CPU), and GCAssist the part of that taken from the goroutines that
	// allocated (mark assists, SQLite's writer among them): this process's collector, the
	// simulated agents' alone with --server.
	GCCPU    time.Duration `json:"gcCpuNs"`
	GCAssist time.Duration `json:"gcAssistNs"`
	// AllocBytes and AllocObjects are what the process allocated on its heap during the
	// phase (the simulated agents' included; theirs alone with --server), and WriterStatements
	// the SQL statements SQLite's writer ran, or on PostgreSQL those the write transactions sent
	// (their BEGIN, COMMIT, savepoints and reads included): counts of work that, unlike times,
	// do not depend on how busy the machine was, to compare builds with.
	AllocBytes       int64 `json:"allocBytes"`
	AllocObjects     int64 `json:"allocObjects"`
	WriterStatements int64 `json:"writerStatements,omitempty"`
	// WriterWALPages are the pages SQLite's writer's commits wrote to its write-ahead log
	// during the phase (a changed page once a commit, however many rows it took): the other
	// count of the writer's work, which rows that share pages lower.
	WriterWALPages int64 `json:"writerWalPages,omitempty"`
	// WriterReprepares are the times SQLite prepared one of the writer's statements again as it
	// ran during the phase (store.Store.RepreparedStatements): a few of SQLite's own; one per
	// machine is a statement whose plan hangs on a value bound to it.
	WriterReprepares int64 `json:"writerReprepares,omitempty"`
	// WriterCommits are the groups of writes the writer committed during the phase, and
	// WriterWrites the writes in them (0 on PostgreSQL): writes per commit is how well the
	// writes shared their commits.
	WriterCommits int64 `json:"writerCommits,omitempty"`
	WriterWrites  int64 `json:"writerWrites,omitempty"`
	// WriterCachedReads are the reads of a node's open workflow SQLite's writer looked up in its
	// cache during the phase, and WriterCacheHits those it found there.
	WriterCachedReads int64 `json:"writerCachedReads,omitempty"`
	WriterCacheHits   int64 `json:"writerCacheHits,omitempty"`
	// WriterCommandReads are the reads of a command by id SQLite's writer looked up in its
	// cache during the phase, and WriterCommandHits those it found there.
	WriterCommandReads int64 `json:"writerCommandReads,omitempty"`
	WriterCommandHits  int64 `json:"writerCommandHits,omitempty"`
	// WriterNodeReads are the reads of a node by id SQLite's writer looked up in its cache
	// during the phase, and WriterNodeHits those it found there.
	WriterNodeReads int64 `json:"writerNodeReads,omitempty"`
	WriterNodeHits  int64 `json:"writerNodeHits,omitempty"`
	// RoundTrips are the round trips to PostgreSQL the servers' write transactions took during
	// the phase (0 on SQLite, and for a server elsewhere).
	RoundTrips int64 `json:"storeRoundTrips,omitempty"`
	// CPUOf is "agents" when the server runs elsewhere (--server): CPU is the simulated
	// agents' alone.
	CPUOf string `json:"cpuOf,omitempty"`
	// ServerCPU and ServerAllocBytes are the CPU time the server used and the bytes its heap
	// allocated during the phase, read from its metrics, when it runs elsewhere (--server; 0
	// in this process, whose own are CPU and AllocBytes): the server's cost per node over the
	// agent gateway, apart from the simulated agents'.
	ServerCPU        time.Duration `json:"serverCpuNs,omitempty"`
	ServerAllocBytes int64         `json:"serverAllocBytes,omitempty"`
	// ServerConnections are the connections the server's agent gateway accepted during the
	// phase (bcd_gateway_connections_total): a TLS handshake each, two per agent boot.
	ServerConnections int64 `json:"serverConnections,omitempty"`
	// Waits are how long the phase's commands waited for an agent (from queued to the agent's
	// acknowledgement), by where they run (site: a site agent; ramdisk: the node's own): where
	// the nodes' time goes besides the commands' own. With --server the mean alone, of the
	// commands that ended in the phase, from the server's metrics.
	Waits map[string]Wait `json:"agentWaits,omitempty"`
	// GateSlots, GateAdmitted, GateWaited and GateBusy are what the engines' gate of
	// CPU-heavy agent work admitted during the phase (engine.GateStats; in this process the
	// simulated machines' keys and signatures too): GateWaited over GateAdmitted is the mean
	// wait for a slot, GateBusy over Total and GateSlots how full the gate was.
	GateSlots    int           `json:"cpuGateSlots,omitempty"`
	GateAdmitted int64         `json:"cpuGateAdmitted,omitempty"`
	GateWaited   time.Duration `json:"cpuGateWaitedNs,omitempty"`
	GateBusy     time.Duration `json:"cpuGateBusyNs,omitempty"`
}

// Wait is how long commands waited for an agent: how many, the mean, and the median and the
// 99th percentile. With --server they are estimated from the server's histogram (Estimated:
// within the bucket that holds them, as Prometheus' histogram_quantile does), or 0 from a
// server whose metrics give the count and the sum alone.
type Wait struct {
	Commands  int           `json:"commands"`
	Mean      time.Duration `json:"meanNs"`
	P50       time.Duration `json:"p50Ns,omitempty"`
	P99       time.Duration `json:"p99Ns,omitempty"`
	Estimated bool          `json:"estimatedFromBuckets,omitempty"`
}

// waitsOf summarizes the waits by where the commands run (Wait), sorting them in place. Pure.
func waitsOf(by map[string][]time.Duration) map[string]Wait {
	out := map[string]Wait{}
	for on, ws := range by {
		if len(ws) == 0 {
			continue
		}
		slices.Sort(ws)
		var sum time.Duration
		for _, w := range ws {
			sum += w
		}
		out[on] = Wait{Commands: len(ws), Mean: sum / time.Duration(len(ws)), P50: ws[len(ws)/2], P99: ws[len(ws)*99/100]}
	}
	return out
}

// waitsSince is what a server elsewhere counted of the waits for an agent between two readings
// of its metrics: the commands and their mean wait, by where they run, and the median and 99th
// percentile estimated from its histogram's buckets when it gave them. Pure.
func waitsSince(before, after map[string]WaitTotal) map[string]Wait {
	out := map[string]Wait{}
	for on, a := range after {
		b := before[on]
		n := a.Commands - b.Commands
		if n <= 0 {
			continue
		}
		w := Wait{Commands: int(n), Mean: (a.Sum - b.Sum) / time.Duration(n)}
		if len(a.Within) > 0 {
			within := make(map[time.Duration]int64, len(a.Within))
			for le, c := range a.Within {
				within[le] = c - b.Within[le]
			}
			p50, ok50 := quantile(within, n, 0.5)
			p99, ok99 := quantile(within, n, 0.99)
			if ok50 && ok99 {
				w.P50, w.P99, w.Estimated = p50, p99, true
			}
		}
		out[on] = w
	}
	return out
}

// quantile estimates the q-quantile (0 < q < 1) of n observations from a histogram's cumulative
// buckets (within: how many were at most each upper bound; those above the largest bound are
// the rest of n), as Prometheus' histogram_quantile does: the observation of rank q·n is placed
// linearly within the bucket that holds it, the first bucket beginning at 0. One in the
// unbounded bucket (above every bound) gives the largest bound, a value it is at least. False
// without observations or bounds, or with buckets that do not add up (a count above n, or one
// below the bucket before it). Pure.
func quantile(within map[time.Duration]int64, n int64, q float64) (time.Duration, bool) {
	if n <= 0 || len(within) == 0 || q <= 0 || q >= 1 {
		return 0, false
	}
	bounds := slices.Sorted(maps.Keys(within))
	rank := q * float64(n)
	lower, below := time.Duration(0), int64(0)
	for _, le := range bounds {
		c := within[le]
		if c < below || c > n || le < 0 {
			return 0, false
		}
		if float64(c) >= rank && c > below {
			frac := (rank - float64(below)) / float64(c-below)
			return lower + time.Duration(frac*float64(le-lower)), true
		}
		lower, below = le, c
	}
	return bounds[len(bounds)-1], true
}

func (p Phase) String() string {
	s := fmt.Sprintf("%-22s %6d nodes in %8s = %7.0f nodes/s  p50 %8s  p99 %8s  failed %d",
		p.Name, p.Nodes, p.Total.Round(time.Millisecond), p.NodesPerSec, p.P50.Round(time.Millisecond), p.P99.Round(time.Millisecond), p.Failed)
	if len(p.Faults) > 0 {
		codes := slices.Sorted(maps.Keys(p.Faults))
		parts := make([]string, len(codes))
		for i, c := range codes {
			parts[i] = fmt.Sprintf("%s %d", c, p.Faults[c])
		}
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	if p.Nodes > 0 && p.CPU > 0 {
		of := ""
		if p.CPUOf != "" {
			of = p.CPUOf + "' "
		}
		s += fmt.Sprintf("  %scpu %.1f ms/node", of, float64(p.CPU)/float64(time.Millisecond)/float64(p.Nodes))
		if p.GCCPU > 0 {
			s += fmt.Sprintf(" (gc %.0f%%)", 100*float64(p.GCCPU)/float64(p.CPU))
		}
	}
	if p.Nodes > 0 && p.AllocBytes > 0 {
		s += fmt.Sprintf("  alloc %.0f KiB/node", float64(p.AllocBytes)/1024/float64(p.Nodes))
	}
	if p.Nodes > 0 && (p.ServerCPU > 0 || p.ServerAllocBytes > 0) {
		s += fmt.Sprintf("  server cpu %.1f ms/node, alloc %.0f KiB/node, %.1f connections/node",
			float64(p.ServerCPU)/float64(time.Millisecond)/float64(p.Nodes), float64(p.ServerAllocBytes)/1024/float64(p.Nodes),
			float64(p.ServerConnections)/float64(p.Nodes))
	}
	if p.Total > 0 && p.WriterBusy > 0 {
		s += fmt.Sprintf("  writer busy %.0f%%", 100*float64(p.WriterBusy)/float64(p.Total))
		if p.Nodes > 0 && p.WriterCPU > 0 {
			s += fmt.Sprintf(" (cpu %.2f ms/node)", float64(p.WriterCPU)/float64(time.Millisecond)/float64(p.Nodes))
		}
	}
	if p.WriterCommits > 0 {
		s += fmt.Sprintf("  %.1f writes/commit", float64(p.WriterWrites)/float64(p.WriterCommits))
	}
	if p.Nodes > 0 && p.WriterStatements > 0 {
		s += fmt.Sprintf("  %.0f statements/node", float64(p.WriterStatements)/float64(p.Nodes))
	}
	if p.Nodes > 0 && p.WriterWALPages > 0 {
		s += fmt.Sprintf("  %.0f WAL pages/node", float64(p.WriterWALPages)/float64(p.Nodes))
	}
	if p.WriterReprepares > 0 {
		s += fmt.Sprintf("  %d statements prepared again", p.WriterReprepares)
	}
	if p.Nodes > 0 && p.RoundTrips > 0 {
		s += fmt.Sprintf("  %.1f round trips/node", float64(p.RoundTrips)/float64(p.Nodes))
	}
	if len(p.Waits) > 0 {
		ons := slices.Sorted(maps.Keys(p.Waits))
		parts := make([]string, len(ons))
		for i, on := range ons {
			w := p.Waits[on]
			if w.P50 == 0 && w.P99 == 0 {
				parts[i] = fmt.Sprintf("%s mean %s", on, w.Mean.Round(time.Millisecond)) // (a server elsewhere, without buckets)
				continue
			}
			if w.Estimated {
				parts[i] = fmt.Sprintf("%s p50 ~%s p99 ~%s", on, w.P50.Round(time.Millisecond), w.P99.Round(time.Millisecond))
				continue
			}
			parts[i] = fmt.Sprintf("%s p50 %s p99 %s", on, w.P50.Round(time.Millisecond), w.P99.Round(time.Millisecond))
		}
		s += "  waited for an agent: " + strings.Join(parts, ", ")
	}
	if p.GateAdmitted > 0 {
		s += fmt.Sprintf("  cpu gate %.1f ms wait/task", float64(p.GateWaited)/float64(time.Millisecond)/float64(p.GateAdmitted))
		if p.GateSlots > 0 && p.Total > 0 {
			s += fmt.Sprintf(" (busy %.0f%%)", 100*float64(p.GateBusy)/float64(p.Total)/float64(p.GateSlots))
		}
	}
	return s
}

// Report is a whole run.
type Report struct {
	Engine     string  `json:"engine"`
	Nodes      int     `json:"nodes"`
	Phases     []Phase `json:"phases"`
	PeakRSSMiB float64 `json:"peakRssMiB"`
	// RSSOf says whose peak RSS it is: "" this process (server and simulated agents); "server,
	// sampled" a server elsewhere, read from its /metrics while phases ran.
	RSSOf       string        `json:"rssOf,omitempty"`
	Commands    int           `json:"commands"`
	RanTwice    int           `json:"commandsRunTwice"`
	EnrollTotal time.Duration `json:"enrollApiNs"`
	// SiteAgentDeaths, RamdiskDeaths and Lost: site agents and ramdisks that died holding
	// commands (Faults.SiteAgentDeath, RamdiskDeath) and the commands that became lost
	// (acknowledged by an agent that went away).
	SiteAgentDeaths int `json:"siteAgentDeaths"`
	RamdiskDeaths   int `json:"ramdiskDeaths"`
	Lost            int `json:"commandsLost"`
	// ServerRestarts is how many times a server elsewhere was seen to restart while the run
	// went on (a crash drill): its counts (CPU, lost commands) run on across each restart.
	ServerRestarts int `json:"serverRestarts,omitempty"`
}

// restartCounter is a Control that sees its server restart (a server elsewhere).
type restartCounter interface{ ServerRestarts() int }

// RunPhases enrolls n nodes and takes them through enroll → ready, deploy → deployed and
// undeploy → ready, timing each phase from the verbs to the last node resting. A node that
// failed (injected faults) rests in maintenance and leaves the run: the next phase takes the
// nodes the last one brought to its state.
func (h *Harness) RunPhases(ctx context.Context, n int, timeout time.Duration, progress func(phase string, done, total int)) (rep Report, err error) {
	rep = Report{Engine: h.control().Engine(), Nodes: n}
	lost0, _ := h.control().CommandsLost(ctx)
	defer func() { h.finish(ctx, &rep, lost0) }()
	// Each phase's machines' keys and presignatures are made before it is timed (prepare): in
	// enrolment a ramdisk boot and two signed results (diagnostics, wipe) a machine, in
	// deployment two boots (the ramdisk, the installed system), in release a boot and a wipe.
	if err := h.prepare(ctx, n, 2*n); err != nil {
		return rep, err
	}
	t0, err := h.mark(ctx)
	if err != nil {
		return rep, err
	}
	ids, err := h.Enroll(ctx, "sim", n)
	if err != nil {
		return rep, err
	}
	rep.EnrollTotal = time.Since(t0.at)
	phase, ids, err := h.measure(ctx, "enroll → ready", ids, t0, "ready", timeout, progress)
	rep.Phases = append(rep.Phases, phase)
	if err != nil {
		return rep, err
	}
	if err := h.prepare(ctx, 2*len(ids), 0); err != nil {
		return rep, err
	}
	t1, err := h.mark(ctx)
	if err != nil {
		return rep, err
	}
	if err := h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "sim-image"}); err != nil {
		return rep, err
	}
	phase, ids, err = h.measure(ctx, "deploy → deployed", ids, t1, "deployed", timeout, progress)
	rep.Phases = append(rep.Phases, phase)
	if err != nil {
		return rep, err
	}
	if err := h.prepare(ctx, len(ids), len(ids)); err != nil {
		return rep, err
	}
	t2, err := h.mark(ctx)
	if err != nil {
		return rep, err
	}
	if err := h.Apply(ctx, provision.VerbUndeploy, ids, metal.VerbInput{Wipe: "quick"}); err != nil {
		return rep, err
	}
	phase, _, err = h.measure(ctx, "undeploy → ready", ids, t2, "ready", timeout, progress)
	rep.Phases = append(rep.Phases, phase)
	return rep, err
}

// prepare makes, before a phase is timed, what its simulated machines make on their own
// processors (Sim.MakeKeys, Sim.MakePresignatures): keys for its boots and presignatures for
// its signed results, less what is left from the phase before.
func (h *Harness) prepare(ctx context.Context, boots, signatures int) error {
	if err := h.Sim.MakeKeys(ctx, boots-h.Sim.keys.left()); err != nil {
		return err
	}
	return h.Sim.MakePresignatures(ctx, signatures-h.Sim.presigs.left())
}

// finish adds what the whole run did to rep: commands run (and run twice), agent deaths, lost
// commands (the server's count less lost0, its count when the run began), the peak RSS.
func (h *Harness) finish(ctx context.Context, rep *Report, lost0 int) {
	rep.Commands, rep.RanTwice = h.Sim.ExecutionSummary()
	rep.SiteAgentDeaths, rep.RamdiskDeaths = h.Sim.SiteAgentDeaths(), h.Sim.RamdiskDeaths()
	if lost, ok := h.control().CommandsLost(ctx); ok {
		rep.Lost = lost - lost0
	}
	if rc, ok := h.control().(restartCounter); ok {
		rep.ServerRestarts = rc.ServerRestarts()
	}
	rep.PeakRSSMiB = peakRSSMiB()
	if h.remote() {
		rep.PeakRSSMiB, rep.RSSOf = h.serverPeak, "server, sampled"
	}
}

// measure waits until every node of ids rests (in want, or failed) and computes the phase's
// figures from the nodes' update times. It returns the nodes that reached want.
func (h *Harness) measure(ctx context.Context, name string, ids []string, m mark, want string, timeout time.Duration, progress func(string, int, int)) (Phase, []string, error) {
	p := Phase{Name: name, Nodes: len(ids)}
	start := m.at
	deadline := time.Now().Add(timeout)
	// Nodes outside this phase may already be in want or failed (failed in an earlier phase,
	// or another run's on a shared server): the phase counts what changed since its mark,
	// taken before its verbs or enrolments.
	base := m.counts
	for {
		counts, err := h.control().CountByState(ctx)
		if err != nil {
			return p, nil, err
		}
		if rss, ok := h.control().ServerRSSMiB(ctx); ok && rss > h.serverPeak {
			h.serverPeak = rss
		}
		rested := counts[want] - base[want] + counts["failed"] - base["failed"]
		if progress != nil {
			progress(name, rested, len(ids))
		}
		if rested >= len(ids) {
			break
		}
		select {
		case err := <-h.Sim.Errors():
			return p, nil, fmt.Errorf("%s: simulated agent: %w", name, err)
		default:
		}
		if time.Now().After(deadline) {
			return p, nil, fmt.Errorf("%s: %d of %d nodes rested after %s (%v)", name, rested, len(ids), timeout, counts)
		}
		// Counting the nodes by state reads every node: often enough for the phase's total
		// (the per-node figures come from the nodes' own update times), rarely enough not to
		// take a core from what is measured.
		time.Sleep(200 * time.Millisecond)
	}
	p.Total = time.Since(start) // (until the last node's rest, below, when its time is known)
	p.CPU = cpuTime() - m.cpu
	rt := readRuntimeTotals()
	p.GCCPU, p.GCAssist = rt.gc-m.rt.gc, rt.assist-m.rt.assist
	p.AllocBytes, p.AllocObjects = rt.allocBytes-m.rt.allocBytes, rt.allocObjects-m.rt.allocObjects
	w := h.control().Writer(ctx)
	p.WriterBusy, p.WriterCPU = w.Busy-m.writer.Busy, w.CPU-m.writer.CPU
	p.WriterCommits, p.WriterWrites = w.Groups-m.writer.Groups, w.Writes-m.writer.Writes
	p.WriterStatements, p.WriterWALPages = w.Statements-m.writer.Statements, w.WALPages-m.writer.WALPages
	p.WriterReprepares = w.Reprepares - m.writer.Reprepares
	p.WriterCachedReads, p.WriterCacheHits = w.CachedReads-m.writer.CachedReads, w.CacheHits-m.writer.CacheHits
	p.WriterCommandReads, p.WriterCommandHits = w.CommandReads-m.writer.CommandReads, w.CommandHits-m.writer.CommandHits
	p.WriterNodeReads, p.WriterNodeHits = w.NodeReads-m.writer.NodeReads, w.NodeHits-m.writer.NodeHits
	p.RoundTrips = h.control().WriteRoundTrips() - m.trips
	if h.remote() {
		p.CPUOf = "agents"
	}
	if m.serverOK {
		if sw, ok := h.control().ServerWork(ctx); ok {
			p.ServerCPU, p.ServerAllocBytes = sw.CPU-m.server.CPU, sw.AllocBytes-m.server.AllocBytes
			p.ServerConnections = sw.Connections - m.server.Connections
			if w := waitsSince(m.server.Waits, sw.Waits); len(w) > 0 {
				p.Waits = w // (the store's own, exact, below when it is this process's)
			}
		}
	}
	if m.gateOK {
		if g, ok := h.control().CPUGate(ctx); ok {
			p.GateSlots = g.Slots
			p.GateAdmitted, p.GateWaited, p.GateBusy = g.Admitted-m.gate.Admitted, g.Waited-m.gate.Waited, g.Busy-m.gate.Busy
		}
	}
	if waits, ok, err := h.control().CommandWaits(ctx, start); err != nil {
		return p, nil, err
	} else if ok {
		p.Waits = waitsOf(waits)
	}
	var lat []time.Duration
	nodes, err := h.control().NodeTimes(ctx, ids)
	if err != nil {
		return p, nil, err
	}
	var reached []string
	of := make(map[string]bool, len(ids))
	for _, id := range ids {
		of[id] = true
	}
	for _, n := range nodes {
		if !of[n.ID] {
			continue // not this phase's: it failed in an earlier one
		}
		switch n.State {
		case "failed":
			p.Failed++
			if p.Faults == nil {
				p.Faults = map[string]int{}
			}
			p.Faults[cmp.Or(n.FaultCode, "(none)")]++
		case want:
			reached = append(reached, n.ID)
		}
		lat = append(lat, n.UpdatedAt.Sub(start))
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		p.P50, p.P99 = lat[len(lat)/2], lat[len(lat)*99/100]
		// The phase ended when its last node rested, not when a count (every 200 ms) saw it:
		// the last node's update time, as the nodes' own times above, when it lies between
		// the mark and that count (a node changed since, or a server's clock ahead of this
		// one, leaves the count's time).
		if last := lat[len(lat)-1]; last > 0 && last < p.Total {
			p.Total = last
		}
	}
	p.NodesPerSec = float64(len(ids)) / p.Total.Seconds()
	return p, reached, nil
}

// mark is the start of a phase: the time, the process's CPU time, the writer's work, the
// store's round trips, the nodes per state, and a server's work when it runs elsewhere
// (serverOK).
type mark struct {
	at       time.Time
	cpu      time.Duration
	rt       runtimeTotals
	writer   store.WriterStats
	trips    int64
	counts   map[string]int
	server   ServerWork
	serverOK bool
	gate     engine.GateStats
	gateOK   bool
}

func (h *Harness) mark(ctx context.Context) (mark, error) {
	counts, err := h.control().CountByState(ctx)
	// (The server's work is read with the counts: a server elsewhere answers both from one
	// reading of its metrics.)
	sw, ok := h.control().ServerWork(ctx)
	gate, gateOK := h.control().CPUGate(ctx)
	return mark{at: time.Now(), cpu: cpuTime(), rt: readRuntimeTotals(), writer: h.control().Writer(ctx), trips: h.control().WriteRoundTrips(),
		counts: counts, server: sw, serverOK: ok, gate: gate, gateOK: gateOK}, err
}

// peakRSSMiB reads the process's peak resident set (VmHWM).
func peakRSSMiB() float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseFloat(f[0], 64)
				return kb / 1024
			}
		}
	}
	return 0
}

// BulkReport is a metal.bulk run: the answer time and the time from approval until every node
// rests.
type BulkReport struct {
	Engine   string        `json:"engine"`
	Nodes    int           `json:"nodes"`
	Verb     string        `json:"verb"`
	Required int           `json:"requiredApprovals"`
	Enroll   Phase         `json:"enroll"`
	Answer   time.Duration `json:"bulkAnswerNs"`
	// AnswerCPU is the process's CPU time during the bulk call (on a shared machine the wall
	// time also counts waiting for a CPU).
	AnswerCPU time.Duration `json:"bulkAnswerCpuNs"`
	Leaves    int           `json:"leaves"`
	Approve   time.Duration `json:"approveAnswerNs"`
	Rest      Phase         `json:"approvalToRest"`
}

// bulkRests is where each bulk verb leaves a ready node.
var bulkRests = map[string]string{"retire": "retired", "inspect": "ready", "manage": "manageable", "deploy": "deployed"}

// RunBulk seeds n ready nodes, requires `required` approvals on the pool, applies verb to
// all of them with one metal.bulk, approves it as other approvers, and times the answer and
// approval → every node rests.
func (h *Harness) RunBulk(ctx context.Context, n int, verb string, required int, timeout time.Duration, progress func(phase string, done, total int)) (BulkReport, error) {
	rep := BulkReport{Engine: string(h.Store.Engine()), Nodes: n, Verb: verb, Required: required}
	want, ok := bulkRests[verb]
	if !ok {
		return rep, fmt.Errorf("bulk benchmark runs retire, inspect, manage or deploy on ready nodes, not %q", verb)
	}
	t0 := time.Now()
	ids, err := h.SeedReady(ctx, "bulk", n)
	if err != nil {
		return rep, err
	}
	rep.Enroll = Phase{Name: "seed ready nodes", Nodes: n, Total: time.Since(t0), NodesPerSec: float64(n) / time.Since(t0).Seconds()}
	if _, err := h.Metal.SetApprovalPolicy(ctx, h.Admin, "pool", "default", required); err != nil {
		return rep, err
	}
	t1, c1 := time.Now(), cpuTime()
	in := metal.BulkInput{Pool: "default", Verb: verb, Nodes: ids, Reason: "benchmark"}
	if verb == "deploy" {
		in.Image = "img" // the catalog image every harness seeds
	}
	res, err := h.Metal.Bulk(ctx, h.Admin, in)
	rep.Answer, rep.AnswerCPU = time.Since(t1), cpuTime()-c1
	if err != nil {
		return rep, err
	}
	rep.Leaves = res.Batch.Leaves
	if progress != nil {
		progress(fmt.Sprintf("metal.bulk answered in %s (CPU %s, %d leaves)", rep.Answer.Round(time.Millisecond), rep.AnswerCPU.Round(time.Millisecond), rep.Leaves), n, n)
	}
	for _, nd := range res.Nodes {
		if !nd.Accepted {
			return rep, fmt.Errorf("node %s refused: %s", nd.Node, nd.Error)
		}
	}
	// Whichever the verb, a machine boots at most twice (a deployment: its ramdisk, then its
	// system) and signs at most two results (a retirement's crypto-erase signs one).
	if err := h.prepare(ctx, 2*len(ids), 2*len(ids)); err != nil {
		return rep, err
	}
	t2, err := h.mark(ctx)
	if err != nil {
		return rep, err
	}
	for i := range required {
		if _, err := h.Metal.Approve(ctx, auth.Principal{Name: fmt.Sprintf("approver-%d", i), Role: auth.Approver}, res.Batch.ID, "benchmark"); err != nil {
			return rep, err
		}
	}
	rep.Approve = time.Since(t2.at)
	h.control().Nudge()
	rep.Rest, _, err = h.measure(ctx, "approval → "+want, ids, t2, want, timeout, progress)
	return rep, err
}

// SeedReady writes n nodes straight into ready (as if enrolled, inspected and commissioned),
// each with its own BMC address, and registers their machines: the bulk benchmark measures
// metal.bulk, not enrollment. One node is enrolled through the API for sealed credential
// references, which the others share.
func (h *Harness) SeedReady(ctx context.Context, prefix string, n int) ([]string, error) {
	first, err := h.Metal.Enroll(ctx, h.Admin, metal.EnrollInput{Name: prefix + "-creds", Pool: "default",
		BMC: metal.BMCInput{Address: "https://10.8.0.1", Username: "admin", Password: "sim-password"}})
	if err != nil {
		return nil, err
	}
	// Maintenance holds its enrollment: it only lends its references.
	if _, _, err := h.Metal.Apply(ctx, h.Admin, provision.VerbMaintenance, metal.VerbInput{Node: first.ID, MaintenanceOn: true, Reason: "credential donor"}); err != nil {
		return nil, err
	}
	pool, err := h.Store.Pool(ctx, "default")
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, n)
	const per = 1000
	for start := 0; start < n; start += per {
		err := h.Store.Write(ctx, func(tx *store.Tx) error {
			ids = ids[:start] // (a write may run again)
			for i := start; i < min(start+per, n); i++ {
				mac := fmt.Sprintf("02:5b:%02x:%02x:%02x:%02x", (i>>24)&0xff, (i>>16)&0xff, (i>>8)&0xff, i&0xff)
				uuid := fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
				nd := store.Node{ID: store.NewID(time.Now()), TenantID: pool.TenantID, SiteID: pool.SiteID, PoolID: pool.ID,
					Name: fmt.Sprintf("%s-%d", prefix, i), State: "ready", Power: "off", HardwareProfile: first.HardwareProfile, Drivers: first.Drivers,
					BMCDriver: first.BMCDriver, BMCAddress: fmt.Sprintf("https://10.%d.%d.%d", 9+(i>>16)&0xff, (i>>8)&0xff, i&0xff),
					BMCUsernameRef: first.BMCUsernameRef, BMCPasswordRef: first.BMCPasswordRef, ProductUUID: uuid, MACs: []string{mac}}
				if err := tx.InsertNode(ctx, &nd); err != nil {
					return err
				}
				ids = append(ids, nd.ID)
				h.Sim.Add(&Machine{NodeID: nd.ID, UUID: uuid, MACs: []string{mac}})
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("seeding ready nodes: %w", err)
		}
	}
	return ids, nil
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runtimeTotals are the Go runtime's counts so far: its garbage collector's CPU time, in all
// and in mark assists (as the runtime estimates them), and the bytes and objects allocated on
// the heap (the runtime's tiny allocations, under 16 bytes and packed together, are not
// counted as objects).
type runtimeTotals struct {
	gc, assist               time.Duration
	allocBytes, allocObjects int64
}

func readRuntimeTotals() runtimeTotals {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/gc/mark/assist:cpu-seconds"},
		{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	seconds := func(v metrics.Value) time.Duration {
		if v.Kind() != metrics.KindFloat64 {
			return 0
		}
		return time.Duration(v.Float64() * float64(time.Second))
	}
	count := func(v metrics.Value) int64 {
		if v.Kind() != metrics.KindUint64 {
			return 0
		}
		return int64(v.Uint64())
	}
	return runtimeTotals{gc: seconds(s[0].Value), assist: seconds(s[1].Value), allocBytes: count(s[2].Value), allocObjects: count(s[3].Value)}
}

// Settled checks where a run left its nodes: each ready (out of maintenance, nothing pending),
// or failed in maintenance with its fault code and message. It returns how many failed and a
// description of every node in neither state. Pure.
func Settled(nodes []store.Node) (failed int, unsettled []string) {
	for _, n := range nodes {
		switch {
		case n.State == "ready" && !n.Maintenance && n.TargetState == "":
		case n.State == "failed" && n.Maintenance && n.FaultCode != "" && n.FaultMsg != "":
			failed++
		default:
			unsettled = append(unsettled, fmt.Sprintf("node %s: %s → %q, maintenance %v, fault %q", n.Name, n.State, n.TargetState, n.Maintenance, n.FaultCode))
		}
	}
	return failed, unsettled
}
