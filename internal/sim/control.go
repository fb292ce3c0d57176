package sim

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"bcd/internal/engine"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// Control is how a harness drives the control plane and reads what it did: in this process
// (the node service and store, inProcess) or through the public API of a running server
// (bcd sim --server; internal/cli implements it over ConnectRPC).
type Control interface {
	// Engine names the store engine ("sqlite", "postgres"; "" when the server does not say).
	Engine() string
	Enroll(ctx context.Context, in metal.EnrollInput) (nodeID string, err error)
	Apply(ctx context.Context, v provision.Verb, in metal.VerbInput) error
	// CountByState counts every node by state.
	CountByState(ctx context.Context) (map[string]int, error)
	// NodeTimes lists the states and last updates of the nodes with these ids; it may list other
	// nodes too (over the API: every node of the run), which callers skip.
	NodeTimes(ctx context.Context, ids []string) ([]NodeTime, error)
	// Nudge tells an in-process engine that work is due (a no-op over the API).
	Nudge()
	// Writer is what SQLite's single writer has done so far: its busy time, the groups it
	// committed and the writes in them (zero when unknown, and on PostgreSQL). A server
	// elsewhere tells it in its metrics.
	Writer(ctx context.Context) store.WriterStats
	// WriteRoundTrips is how many round trips to PostgreSQL the servers' write transactions
	// have taken so far (0 when unknown, or on SQLite).
	WriteRoundTrips() int64
	// ServerRSSMiB is the server's resident memory now, when the server is not this process
	// (false: measure this process instead).
	ServerRSSMiB(ctx context.Context) (float64, bool)
	// ServerWork is what the server has used since it started, when it is not this process
	// (false: it is this process, or the server does not say).
	ServerWork(ctx context.Context) (ServerWork, bool)
	// CommandsLost is how many commands the server recorded lost since it started (false:
	// not known).
	CommandsLost(ctx context.Context) (int, bool)
	// CPUGate is what the servers' gates of CPU-heavy agent work admitted so far (false: not
	// known).
	CPUGate(ctx context.Context) (engine.GateStats, bool)
	// CommandWaits lists how long the commands queued since then waited for an agent, by
	// where they run (store.CommandWaits; false: not known, the store being elsewhere).
	CommandWaits(ctx context.Context, since time.Time) (map[string][]time.Duration, bool, error)
}

// ServerWork is what a server elsewhere used since it started, as its metrics count it: its
// process's CPU time, the bytes its Go heap allocated, and the connections its agent gateway
// accepted (each a TLS handshake).
type ServerWork struct {
	CPU         time.Duration
	AllocBytes  int64
	Connections int64
	// Waits are the commands that ended and how long they waited for an agent, by where they
	// run (bcd_command_queue_wait_seconds' count, sum and buckets, its kinds summed by their
	// target).
	Waits map[string]WaitTotal
}

// WaitTotal is how many commands waited for an agent, how long in all, and how many of them
// waited at most each of the histogram's bounds (its cumulative buckets, the unbounded one left
// out: that is Commands; nil from a server that gives none).
type WaitTotal struct {
	Commands int64
	Sum      time.Duration
	Within   map[time.Duration]int64
}

// Plus is t with o's commands, time and buckets added (neither's buckets changed). Pure.
func (t WaitTotal) Plus(o WaitTotal) WaitTotal {
	sum := WaitTotal{Commands: t.Commands + o.Commands, Sum: t.Sum + o.Sum}
	if len(t.Within)+len(o.Within) > 0 {
		sum.Within = make(map[time.Duration]int64, max(len(t.Within), len(o.Within)))
		for _, from := range []map[time.Duration]int64{t.Within, o.Within} {
			for le, c := range from {
				sum.Within[le] += c
			}
		}
	}
	return sum
}

// NodeTime is a node's state, last update and, when it failed, its fault code.
type NodeTime struct {
	ID, State, FaultCode string
	UpdatedAt            time.Time
}

// inProcess is Control over the harness's own node service and store.
type inProcess struct{ h *Harness }

func (c inProcess) Engine() string { return string(c.h.Store.Engine()) }

func (c inProcess) Enroll(ctx context.Context, in metal.EnrollInput) (string, error) {
	n, err := c.h.Metal.Enroll(ctx, c.h.Admin, in)
	return n.ID, err
}

func (c inProcess) Apply(ctx context.Context, v provision.Verb, in metal.VerbInput) error {
	_, _, err := c.h.Metal.Apply(ctx, c.h.Admin, v, in)
	return err
}

func (c inProcess) CountByState(ctx context.Context) (map[string]int, error) {
	return c.h.Store.CountByState(ctx)
}

func (c inProcess) NodeTimes(ctx context.Context, ids []string) ([]NodeTime, error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	var out []NodeTime
	after := ""
	for {
		nodes, err := c.h.Store.Nodes(ctx, store.NodeFilter{AfterID: after, Limit: 5000})
		if err != nil {
			return nil, err
		}
		for _, n := range nodes {
			if want[n.ID] {
				out = append(out, NodeTime{ID: n.ID, State: n.State, FaultCode: n.FaultCode, UpdatedAt: store.Micros(n.UpdatedAt)})
			}
		}
		if len(nodes) < 5000 {
			return out, nil
		}
		after = nodes[len(nodes)-1].ID
	}
}

func (c inProcess) Nudge() { c.h.nudge() }

func (c inProcess) Writer(context.Context) store.WriterStats { return c.h.Store.WriterStats() }

func (c inProcess) WriteRoundTrips() int64 {
	if len(c.h.stores) == 0 {
		return c.h.Store.WriteRoundTrips()
	}
	n := int64(0)
	for _, st := range c.h.stores {
		n += st.WriteRoundTrips()
	}
	return n
}

func (c inProcess) ServerRSSMiB(context.Context) (float64, bool) { return 0, false }

func (c inProcess) ServerWork(context.Context) (ServerWork, bool) { return ServerWork{}, false }

func (c inProcess) CPUGate(context.Context) (engine.GateStats, bool) {
	var sum engine.GateStats
	for _, e := range c.h.engines {
		g := e.CPUGate()
		sum.Slots += g.Slots
		sum.Admitted, sum.Waited, sum.Busy = sum.Admitted+g.Admitted, sum.Waited+g.Waited, sum.Busy+g.Busy
	}
	return sum, sum.Slots > 0
}

func (c inProcess) CommandWaits(ctx context.Context, since time.Time) (map[string][]time.Duration, bool, error) {
	w, err := c.h.Store.CommandWaits(ctx, since.UnixMicro())
	return w, err == nil, err
}

func (c inProcess) CommandsLost(context.Context) (int, bool) {
	n := int64(0)
	for _, e := range c.h.engines {
		n += e.CommandsLost()
	}
	return int(n), true
}

// Remote is a running server as StartRemote needs it: its API (ctl) and what a site agent
// joins it with.
type Remote struct {
	Control Control
	// SiteID is the site the simulated machines belong to; JoinToken a site agent bootstrap
	// token for it; GatewayURL and CAPEM where and whom the agents dial.
	SiteID, JoinToken, GatewayURL string
	CAPEM                         []byte
	// Salt makes this run's MACs and product UUIDs differ from other runs' on the same server
	// (any byte but 0 and 0x5a, the in-process harness's).
	Salt byte
}

// StartRemote builds a harness whose simulated site agent and ramdisks join a server that runs
// elsewhere, through its agent gateway (mTLS, join tokens, agentlink), and whose enrolments,
// verbs and measurements go through the server's public API (r.Control). The server's pool
// "default" must belong to r.SiteID and its catalog must hold the image the run deploys.
func StartRemote(ctx context.Context, r Remote, cfg Config, dataDir string) (*Harness, error) {
	if r.Control == nil || r.JoinToken == "" || r.GatewayURL == "" || len(r.CAPEM) == 0 {
		return nil, fmt.Errorf("a remote simulation needs the server's API, a site join token, its gateway URL and its CA")
	}
	cfg.SiteID = r.SiteID
	cfg.Gateway = &GatewayTarget{URL: r.GatewayURL, CAPEM: r.CAPEM, DataDir: filepath.Join(dataDir, "os")}
	h := &Harness{Sim: New(cfg, nil), SiteID: r.SiteID, ctl: r.Control, salt: r.Salt, done: make(chan struct{})}
	if err := h.joinSiteAgent(ctx, r.JoinToken, dataDir); err != nil {
		return nil, err
	}
	return h, nil
}

// joinSiteAgent runs the simulated site agent over the gateway, joined with token, until the
// harness stops.
func (h *Harness) joinSiteAgent(ctx context.Context, token, dataDir string) error {
	rctx, cancel := context.WithCancel(ctx)
	h.cancel = cancel
	link, err := h.Sim.RunSiteAgentOverGateway(rctx, token, filepath.Join(dataDir, "site-agent"))
	if err != nil {
		cancel()
		return err
	}
	go func() {
		defer close(h.done)
		<-rctx.Done()
		link.Wait()
	}()
	return nil
}

// remote reports whether the harness drives a server elsewhere (StartRemote).
func (h *Harness) remote() bool { return h.ctl != nil }

// control is the harness's Control: the one it was started with, else its own service.
func (h *Harness) control() Control {
	if h.ctl != nil {
		return h.ctl
	}
	return inProcess{h}
}
