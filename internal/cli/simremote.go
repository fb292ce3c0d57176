package cli

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/command"
	"bcd/internal/engine"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/sim"
	"bcd/internal/store"
)

// simRunLabel marks the nodes of one remote simulation run (so that its measurements read only
// its own nodes, and its names and MACs never meet an earlier run's).
const simRunLabel = "bcd-sim-run"

// apiControl is sim.Control over a running server's public API (bcd sim --server).
type apiControl struct {
	cl     *clients
	images bcdv1connect.ImageServiceClient
	hc     *http.Client
	base   string
	run    string
	salt   byte
	// baseline are the server's nodes by state before the run (other nodes of the server,
	// assumed still while it runs).
	baseline map[string]int

	// tell is where the run says that the server stopped answering, answers again, or
	// restarted (nil: nowhere).
	tell io.Writer
	// outage is how long the run waits for a server that stopped answering (serverOutage).
	outage time.Duration

	mu      sync.Mutex
	scraped time.Time
	// last is the last reading as the run reports it: raw, the server's last reading as it
	// gave it, plus carried, the counters of its earlier lives (restarts counts them).
	last, raw, carried serverMetrics
	restarts           int
	// down is when the server first failed to answer, zero while it answers.
	down time.Time
}

// serverOutage is how long a run against a server waits for it to answer again (a restart, a
// crash drill) before it gives up.
const serverOutage = 2 * time.Minute

// serverMetrics is what the simulation reads from the server's /metrics.
type serverMetrics struct {
	states map[string]int // bcd_nodes
	rssMiB float64        // process_resident_memory_bytes
	lost   int            // bcd_commands_lost_total
	// cpu and allocBytes: process_cpu_seconds_total and go_memstats_alloc_bytes_total, each
	// there when its ok is.
	cpu            time.Duration
	allocBytes     int64
	cpuOK, allocOK bool
	// gwConns: bcd_gateway_connections_total (0 from a server without its gateway's counts).
	gwConns int64
	// started: process_start_time_seconds, there when startedOK is (a new value: the server
	// restarted).
	started   float64
	startedOK bool
	// writer: the SQLite writer's counters (bcd_store_writer_busy_seconds_total and the
	// others, store.WriterStats' names; zero from a server on PostgreSQL).
	writer store.WriterStats
	// gate: the engine's CPU gate (bcd_engine_cpu_gate_*; zero from a server without them).
	gate engine.GateStats
	// waits: bcd_command_queue_wait_seconds' count, sum and buckets, its kinds summed by where
	// they run (site, ramdisk); kinds this client does not know are left out.
	waits map[string]sim.WaitTotal
}

// restartedSince reports whether the server that gave m is another process than the one that
// gave prev: its start time moved, or a counter went down (counters only grow within a
// process). Pure.
func (m serverMetrics) restartedSince(prev serverMetrics) bool {
	switch {
	case m.startedOK && prev.startedOK:
		return m.started != prev.started
	case m.cpuOK && prev.cpuOK && m.cpu < prev.cpu, m.allocOK && prev.allocOK && m.allocBytes < prev.allocBytes:
		return true
	default:
		return m.lost < prev.lost || m.gwConns < prev.gwConns
	}
}

// plus is m with the counters of c added (the gauges, nodes by state and RSS, are m's). Pure.
func (m serverMetrics) plus(c serverMetrics) serverMetrics {
	m.cpu += c.cpu
	m.allocBytes += c.allocBytes
	m.lost += c.lost
	m.gwConns += c.gwConns
	w, cw := &m.writer, c.writer
	w.Busy, w.CPU, w.Groups, w.Writes = w.Busy+cw.Busy, w.CPU+cw.CPU, w.Groups+cw.Groups, w.Writes+cw.Writes
	w.Statements, w.WALPages, w.Reprepares = w.Statements+cw.Statements, w.WALPages+cw.WALPages, w.Reprepares+cw.Reprepares
	m.gate.Admitted, m.gate.Waited, m.gate.Busy = m.gate.Admitted+c.gate.Admitted, m.gate.Waited+c.gate.Waited, m.gate.Busy+c.gate.Busy
	waits := make(map[string]sim.WaitTotal, len(m.waits))
	for _, from := range []map[string]sim.WaitTotal{m.waits, c.waits} {
		for on, w := range from {
			waits[on] = waits[on].Plus(w)
		}
	}
	m.waits = waits
	return m
}

func newAPIControl(ctx context.Context, g *globals) (*apiControl, error) {
	cl, err := g.clients()
	if err != nil {
		return nil, err
	}
	hc, err := g.apiHTTP()
	if err != nil {
		return nil, err
	}
	b := make([]byte, 3)
	rand.Read(b)
	c := &apiControl{cl: cl, images: cl.images, hc: hc, base: strings.TrimSuffix(g.server, "/"), run: "r" + hex.EncodeToString(b), salt: b[0],
		tell: g.env.Stderr, outage: serverOutage}
	if c.salt == 0 || c.salt == 0x5a {
		c.salt = 1
	}
	m, err := c.scrape(ctx)
	if err != nil {
		return nil, err
	}
	states := m.states
	c.baseline = states
	return c, nil
}

// Run names this run (its label value and the prefix of its node names).
func (c *apiControl) Run() string { return c.run }

func (c *apiControl) Engine() string { return "the server at " + c.base }

func (c *apiControl) Enroll(ctx context.Context, in metal.EnrollInput) (string, error) {
	var id string
	err := c.retry(ctx, unsent, func() error {
		resp, err := c.cl.nodes.Enroll(ctx, connect.NewRequest(&bcdv1.EnrollRequest{
			Name: c.run + "-" + in.Name, Pool: in.Pool, Macs: in.MACs, ProductUuid: in.ProductUUID,
			Bmc:    &bcdv1.BmcCredentials{Address: in.BMC.Address, Username: in.BMC.Username, Password: in.BMC.Password},
			Labels: map[string]string{simRunLabel: c.run}, Reason: "bcd sim"}))
		if err == nil {
			id = resp.Msg.Node.GetId()
		}
		return err
	})
	return id, err
}

func (c *apiControl) Apply(ctx context.Context, v provision.Verb, in metal.VerbInput) error {
	var call func() error
	switch v {
	case provision.VerbDeploy:
		call = func() error {
			_, err := c.cl.nodes.Deploy(ctx, connect.NewRequest(&bcdv1.DeployRequest{Node: in.Node, Image: in.Image, Profile: in.Profile, Reason: "bcd sim"}))
			return err
		}
	case provision.VerbUndeploy:
		call = func() error {
			_, err := c.cl.nodes.Undeploy(ctx, connect.NewRequest(&bcdv1.UndeployRequest{Node: in.Node, Wipe: in.Wipe, Reason: "bcd sim"}))
			return err
		}
	default:
		return fmt.Errorf("a remote simulation applies deploy and undeploy, not %s", v)
	}
	return c.retry(ctx, unsent, call)
}

// unsent reports whether err says a call never reached a server (its connection was refused:
// the server is down or restarting), so that sending it again cannot apply it twice. Pure.
func unsent(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// unanswered reports whether a read failed for want of a server (unsent, or the connection
// broke or the server was unavailable): reading again is harmless. Pure.
func unanswered(err error) bool { return unsent(err) || connect.CodeOf(err) == connect.CodeUnavailable }

// retry runs call until it succeeds, fails for another reason than again says, or the server
// has not answered for c.outage: a server restarting mid-run (a crash drill) is waited for.
func (c *apiControl) retry(ctx context.Context, again func(error) bool, call func() error) error {
	var since time.Time
	wait := 50 * time.Millisecond
	for {
		err := call()
		if err == nil || !again(err) {
			return err
		}
		if since.IsZero() {
			since = time.Now()
		} else if time.Since(since) > c.outage {
			return fmt.Errorf("no server answered for %s: %w", c.outage, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// CountByState counts the server's nodes by state, less those it had before the run.
func (c *apiControl) CountByState(ctx context.Context) (map[string]int, error) {
	m, err := c.scrape(ctx)
	if err != nil {
		return nil, err
	}
	states := m.states
	out := map[string]int{}
	for s, n := range states {
		out[s] = n - c.baseline[s]
	}
	return out, nil
}

func (c *apiControl) NodeTimes(ctx context.Context, ids []string) ([]sim.NodeTime, error) {
	var out []sim.NodeTime
	token := ""
	for {
		var resp *connect.Response[bcdv1.ListNodesResponse]
		err := c.retry(ctx, unanswered, func() (err error) {
			resp, err = c.cl.nodes.List(ctx, connect.NewRequest(&bcdv1.ListNodesRequest{Labels: []string{simRunLabel + "=" + c.run}, PageSize: 10000, PageToken: token}))
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("listing the run's nodes: %w", err)
		}
		for _, n := range resp.Msg.Nodes {
			at, err := time.Parse(time.RFC3339Nano, n.UpdatedAt)
			if err != nil {
				return nil, fmt.Errorf("node %s: update time %q: %w", n.Id, n.UpdatedAt, err)
			}
			out = append(out, sim.NodeTime{ID: n.Id, State: n.State, FaultCode: n.FaultCode, UpdatedAt: at})
		}
		if token = resp.Msg.NextPageToken; token == "" {
			return out, nil
		}
	}
}

func (c *apiControl) Nudge() {}

// Writer is the server's SQLite writer's work since it started (over its restarts during the
// run), from its metrics: zero if they cannot be read, or on PostgreSQL.
func (c *apiControl) Writer(ctx context.Context) store.WriterStats {
	m, _ := c.scrape(ctx)
	return m.writer
}

func (c *apiControl) WriteRoundTrips() int64 { return 0 }

func (c *apiControl) ServerRSSMiB(ctx context.Context) (float64, bool) {
	m, err := c.scrape(ctx)
	return m.rssMiB, err == nil
}

// ServerWork is the server's CPU time, heap allocations and gateway connections since it
// started.
func (c *apiControl) ServerWork(ctx context.Context) (sim.ServerWork, bool) {
	m, err := c.scrape(ctx)
	return sim.ServerWork{CPU: m.cpu, AllocBytes: m.allocBytes, Connections: m.gwConns, Waits: m.waits}, err == nil && m.cpuOK && m.allocOK
}

// CPUGate is what the server's CPU gate admitted since it started (over its restarts during
// the run), from its metrics.
func (c *apiControl) CPUGate(ctx context.Context) (engine.GateStats, bool) {
	m, err := c.scrape(ctx)
	return m.gate, err == nil && m.gate.Slots > 0
}

// CommandWaits is not known of a server elsewhere: its store is not this process's.
func (c *apiControl) CommandWaits(context.Context, time.Time) (map[string][]time.Duration, bool, error) {
	return nil, false, nil
}

// CommandsLost is the server's count of lost commands since it started (over its restarts
// during the run).
func (c *apiControl) CommandsLost(ctx context.Context) (int, bool) {
	m, err := c.scrape(ctx)
	return m.lost, err == nil
}

// ServerRestarts is how many times the server was seen to restart during the run.
func (c *apiControl) ServerRestarts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.restarts
}

// scrape reads the server's /metrics (serverMetrics), at most every 100 ms. A server that stops
// answering after it once did is waited for, for c.outage, with its last reading; one that
// answers as another process (restarted) has its counters carried on from its last reading,
// so that what the run measures spans the restart (less what the server did between that
// reading and its end).
func (c *apiControl) scrape(ctx context.Context) (serverMetrics, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.scraped) < 100*time.Millisecond {
		return c.last, nil
	}
	m, err := c.readMetrics(ctx)
	now := time.Now()
	if err != nil {
		switch {
		case c.scraped.IsZero() || ctx.Err() != nil:
			return serverMetrics{}, err
		case c.down.IsZero():
			c.down = now
			c.say("the server does not answer (%v): waiting up to %s for it", err, c.outage)
		case now.Sub(c.down) > c.outage:
			return serverMetrics{}, fmt.Errorf("%w (no answer for %s)", err, now.Sub(c.down).Round(time.Second))
		}
		return c.last, nil
	}
	if !c.down.IsZero() {
		c.say("the server answers again after %s", now.Sub(c.down).Round(time.Millisecond))
		c.down = time.Time{}
	}
	if !c.scraped.IsZero() && m.restartedSince(c.raw) {
		c.carried = c.carried.plus(c.raw)
		c.restarts++
		c.say("the server restarted (restart %d seen by this run): its figures are counted on from its last reading before", c.restarts)
	}
	c.raw = m
	c.scraped, c.last = now, m.plus(c.carried)
	return c.last, nil
}

// readMetrics reads the server's /metrics once.
func (c *apiControl) readMetrics(ctx context.Context) (serverMetrics, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/metrics", nil)
	if err != nil {
		return serverMetrics{}, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return serverMetrics{}, fmt.Errorf("reading the server's metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return serverMetrics{}, fmt.Errorf("reading the server's metrics: %s", resp.Status)
	}
	return parseMetrics(bufio.NewScanner(resp.Body))
}

// say tells the run's user what happened to the server, on a line of its own.
func (c *apiControl) say(format string, args ...any) {
	if c.tell != nil {
		fmt.Fprintf(c.tell, "\n%s: "+format+"\n", append([]any{time.Now().Format(time.TimeOnly)}, args...)...)
	}
}

// parseMetrics reads bcd_nodes{state="…"}, process_resident_memory_bytes,
// bcd_commands_lost_total, process_cpu_seconds_total, go_memstats_alloc_bytes_total,
// bcd_gateway_connections_total, process_start_time_seconds, the SQLite writer's counters, the
// CPU gate's and the count, sum and buckets of bcd_command_queue_wait_seconds from a Prometheus
// text exposition.
func parseMetrics(sc *bufio.Scanner) (serverMetrics, error) {
	m := serverMetrics{states: map[string]int{}, waits: map[string]sim.WaitTotal{}}
	value := func(line, v string) (float64, error) {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("server metrics: %q: %w", line, err)
		}
		return f, nil
	}
	// The metrics without labels, each a name, a space and its value.
	plain := map[string]func(float64){
		"process_resident_memory_bytes":          func(f float64) { m.rssMiB = f / (1 << 20) },
		"bcd_commands_lost_total":                func(f float64) { m.lost = int(f) },
		"process_cpu_seconds_total":              func(f float64) { m.cpu, m.cpuOK = time.Duration(f*float64(time.Second)), true },
		"go_memstats_alloc_bytes_total":          func(f float64) { m.allocBytes, m.allocOK = int64(f), true },
		"bcd_gateway_connections_total":          func(f float64) { m.gwConns = int64(f) },
		"process_start_time_seconds":             func(f float64) { m.started, m.startedOK = f, true },
		"bcd_store_writer_busy_seconds_total":    func(f float64) { m.writer.Busy = time.Duration(f * float64(time.Second)) },
		"bcd_store_writer_cpu_seconds_total":     func(f float64) { m.writer.CPU = time.Duration(f * float64(time.Second)) },
		"bcd_store_writer_commits_total":         func(f float64) { m.writer.Groups = int64(f) },
		"bcd_store_writes_total":                 func(f float64) { m.writer.Writes = int64(f) },
		"bcd_store_writer_statements_total":      func(f float64) { m.writer.Statements = int64(f) },
		"bcd_store_wal_pages_total":              func(f float64) { m.writer.WALPages = int64(f) },
		"bcd_store_writer_reprepares_total":      func(f float64) { m.writer.Reprepares = int64(f) },
		"bcd_engine_cpu_gate_slots":              func(f float64) { m.gate.Slots = int(f) },
		"bcd_engine_cpu_gate_admissions_total":   func(f float64) { m.gate.Admitted = int64(f) },
		"bcd_engine_cpu_gate_wait_seconds_total": func(f float64) { m.gate.Waited = time.Duration(f * float64(time.Second)) },
		"bcd_engine_cpu_gate_busy_seconds_total": func(f float64) { m.gate.Busy = time.Duration(f * float64(time.Second)) },
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, waitSeries+"_"):
			series, kind, le, v, ok := waitLine(line)
			if !ok {
				return serverMetrics{}, fmt.Errorf("server metrics: cannot read %q", line)
			}
			if series == "" || le == "+Inf" {
				continue // (another series; the count)
			}
			f, err := value(line, v)
			if err != nil {
				return serverMetrics{}, err
			}
			k, err := command.Lookup(kind)
			if err != nil {
				continue // a kind of a newer server: not counted
			}
			w := m.waits[string(k.RunsOn)]
			switch series {
			case "sum":
				w.Sum += time.Duration(f * float64(time.Second))
			case "count":
				w.Commands += int64(f)
			default: // a bucket
				bound, err := value(line, le)
				if err != nil {
					return serverMetrics{}, err
				}
				if w.Within == nil {
					w.Within = map[time.Duration]int64{}
				}
				w.Within[time.Duration(math.Round(bound*float64(time.Second)))] += int64(f)
			}
			m.waits[string(k.RunsOn)] = w
		case strings.HasPrefix(line, `bcd_nodes{state="`):
			state, v, ok := strings.Cut(strings.TrimPrefix(line, `bcd_nodes{state="`), `"} `)
			if !ok {
				return serverMetrics{}, fmt.Errorf("server metrics: cannot read %q", line)
			}
			f, err := value(line, v)
			if err != nil {
				return serverMetrics{}, err
			}
			m.states[state] = int(f)
		default:
			name, v, ok := strings.Cut(line, " ")
			if set := plain[name]; ok && set != nil {
				f, err := value(line, v)
				if err != nil {
					return serverMetrics{}, err
				}
				set(f)
			}
		}
	}
	return m, sc.Err()
}

// waitSeries is the server's histogram of the commands' waits for an agent.
const waitSeries = "bcd_command_queue_wait_seconds"

// waitLine reads a line of waitSeries' bucket, sum or count series: the series, the command
// kind, the bucket's bound (a bucket's only) and the value; series "" for another of its
// series (a newer server's), not read. ok false: a line of those three that cannot be read.
// Pure.
func waitLine(line string) (series, kind, le, v string, ok bool) {
	series, rest, _ := strings.Cut(strings.TrimPrefix(line, waitSeries+"_"), "{")
	if series != "bucket" && series != "sum" && series != "count" {
		return "", "", "", "", true
	}
	labels, v, ok := strings.Cut(strings.TrimPrefix(rest, `kind="`), `"} `)
	if !ok || !strings.HasPrefix(rest, `kind="`) {
		return "", "", "", "", false
	}
	if series == "bucket" {
		kind, le, ok = strings.Cut(labels, `",le="`)
		return series, kind, le, v, ok
	}
	return series, labels, "", v, true
}

// startRemoteSim prepares a running server for a simulation (the image it deploys, a site agent
// join token) and starts simulated agents against it.
func startRemoteSim(ctx context.Context, g *globals, cfg sim.Config, site, image, dataDir string) (*sim.Harness, *apiControl, error) {
	c, err := newAPIControl(ctx, g)
	if err != nil {
		return nil, nil, err
	}
	if err := c.ensureImage(ctx, image); err != nil {
		return nil, nil, err
	}
	sites, err := c.cl.inventory.ListSites(ctx, connect.NewRequest(&bcdv1.ListSitesRequest{}))
	if err != nil {
		return nil, nil, fmt.Errorf("listing sites: %w", err)
	}
	siteID := ""
	for _, s := range sites.Msg.Sites {
		if s.Name == site || s.Id == site {
			siteID = s.Id
		}
	}
	if siteID == "" {
		return nil, nil, fmt.Errorf("the server has no site %q (its pool \"default\" must belong to it)", site)
	}
	tok, err := c.cl.inventory.CreateSiteJoinToken(ctx, connect.NewRequest(&bcdv1.CreateSiteJoinTokenRequest{Site: site, TtlSeconds: 3600}))
	if err != nil {
		return nil, nil, fmt.Errorf("minting a site agent join token: %w", err)
	}
	salt := c.salt
	h, err := sim.StartRemote(ctx, sim.Remote{Control: c, SiteID: siteID, JoinToken: tok.Msg.Token, GatewayURL: tok.Msg.GatewayUrl,
		CAPEM: []byte(tok.Msg.CaPem), Salt: salt}, cfg, dataDir)
	return h, c, err
}

// ensureImage adds the simulated image to the server's catalog unless it holds it, signed by a
// signer made for the run.
func (c *apiControl) ensureImage(ctx context.Context, name string) error {
	list, err := c.images.ListImages(ctx, connect.NewRequest(&bcdv1.ListImagesRequest{}))
	if err != nil {
		return fmt.Errorf("listing images: %w", err)
	}
	for _, img := range list.Msg.Images {
		if img.Name == name {
			return nil
		}
	}
	pub, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		return err
	}
	signer := "sim-" + c.run
	if _, err := c.images.AddSigner(ctx, connect.NewRequest(&bcdv1.AddSignerRequest{Signer: &bcdv1.Signer{Name: signer, PublicKey: pub}})); err != nil {
		return fmt.Errorf("adding signer %s: %w", signer, err)
	}
	img := sim.Image(name, signer, key)
	_, err = c.images.AddImage(ctx, connect.NewRequest(&bcdv1.AddImageRequest{Image: &bcdv1.Image{Name: img.Name, Url: img.URL, Size: img.Size,
		Format: img.Format, Compression: img.Compression, Sha256: img.SHA256, Signer: img.Signer, Signature: img.Signature}}))
	if err != nil {
		return fmt.Errorf("adding image %s: %w", name, err)
	}
	return nil
}
