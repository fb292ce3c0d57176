package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/auth"
	"bcd/internal/engine"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/server"
	"bcd/internal/sim"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/testproc"
)

// TestServerProcess is the child of TestCrashSafety and TestReplicas: a bcd server on fixed
// ports that runs until it is killed. It does nothing in a normal test run.
func TestServerProcess(t *testing.T) {
	dir := os.Getenv("BCD_CRASH_CHILD_DIR")
	if dir == "" {
		t.Skip("child process of TestCrashSafety and TestReplicas only")
	}
	duration := func(name string) time.Duration {
		v := os.Getenv(name)
		if v == "" {
			return 0
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	srv, err := server.New(context.Background(), server.Config{Listen: os.Getenv("BCD_CRASH_API"), GatewayListen: os.Getenv("BCD_CRASH_GATEWAY"), DataDir: dir,
		StoreDSN: os.Getenv("BCD_CRASH_STORE"), Key: os.Getenv("BCD_CRASH_KEY"), GatewayURL: os.Getenv("BCD_CRASH_GATEWAY_URL"),
		Engine: engine.Config{Lease: duration("BCD_CRASH_LEASE"), PeerTimeout: duration("BCD_CRASH_PEER_TIMEOUT")}},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if tok := srv.FirstAdminToken(); tok != "" {
		if err := sim.SeedImages(context.Background(), srv.Service(), auth.Principal{Name: "test", Role: auth.Admin}, "img"); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "admin-token"), []byte(tok), 0o600)
	}
	srv.Serve(context.Background()) // until SIGKILL
}

// serverProc is a bcd server in a child process (TestServerProcess), on its own data dir and
// ports.
type serverProc struct {
	t            *testing.T
	dir, api, gw string
	env          []string
	proc         *testproc.Proc // nil: not started, or killed
}

func newServerProc(t *testing.T, dsn, api, gw string, env ...string) *serverProc {
	p := &serverProc{t: t, dir: t.TempDir(), api: api, gw: gw}
	p.env = append([]string{"BCD_CRASH_CHILD_DIR=" + p.dir, "BCD_CRASH_API=" + p.api, "BCD_CRASH_GATEWAY=" + p.gw, "BCD_CRASH_STORE=" + dsn}, env...)
	t.Cleanup(p.kill)
	return p
}

// start starts the server process and returns once its API answers, or why it did not (with
// the process's output).
func (p *serverProc) start() error {
	out, err := os.Create(filepath.Join(p.dir, "server.out"))
	if err != nil {
		return err
	}
	defer out.Close()
	proc, err := testproc.StartHTTP("TestServerProcess", p.env, out, p.api)
	if proc != nil {
		p.proc = proc
	}
	return err
}

// kill SIGKILLs the server process, if it runs.
func (p *serverProc) kill() {
	if p.proc == nil {
		return
	}
	p.proc.Kill()
	p.proc = nil
}

// adminToken is the admin token the server minted at the installation's first start, if this
// server was the one that did.
func (p *serverProc) adminToken() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "admin-token"))
	return string(b)
}

// fleet is n simulated machines and a simulated site agent that reach the control plane
// through its API at base and its gateway (as the join token names it), and the checks run on
// them while servers are killed under them.
type fleet struct {
	t     *testing.T
	ctx   context.Context
	dsn   string
	s     *sim.Sim
	nodes bcdv1connect.NodeServiceClient
	ids   []string
}

func newFleet(t *testing.T, ctx context.Context, base, token, dsn, dir string, n int) *fleet {
	t.Helper()
	auth := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			r.Header().Set("Authorization", "Bearer "+token)
			return next(ctx, r)
		}
	}))
	f := &fleet{t: t, ctx: ctx, dsn: dsn, nodes: bcdv1connect.NewNodeServiceClient(http.DefaultClient, base, auth)}
	inv := bcdv1connect.NewInventoryServiceClient(http.DefaultClient, base, auth)
	jt, err := inv.CreateSiteJoinToken(ctx, connect.NewRequest(&bcdv1.CreateSiteJoinTokenRequest{Site: "default"}))
	if err != nil {
		t.Fatal(err)
	}
	sites, err := inv.ListSites(ctx, connect.NewRequest(&bcdv1.ListSitesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	f.s = sim.New(sim.Config{SiteID: sites.Msg.Sites[0].Id, Gateway: &sim.GatewayTarget{URL: jt.Msg.GatewayUrl, CAPEM: []byte(jt.Msg.CaPem), DataDir: filepath.Join(dir, "os")}}, nil)
	agentCtx, stopAgents := context.WithCancel(ctx)
	link, err := f.s.RunSiteAgentOverGateway(agentCtx, jt.Msg.Token, filepath.Join(dir, "site-agent"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopAgents(); link.Wait(); f.s.Wait() })
	for i := range n {
		mac, uuid := fmt.Sprintf("02:cc:00:00:00:%02x", i), fmt.Sprintf("%08x-2222-4333-8444-555555555555", i)
		resp, err := f.nodes.Enroll(ctx, connect.NewRequest(&bcdv1.EnrollRequest{Name: fmt.Sprintf("c-%d", i), Pool: "default", Macs: []string{mac}, ProductUuid: uuid,
			Bmc: &bcdv1.BmcCredentials{Address: "https://10.30.0.1", Username: "root", Password: "crash-test-password"}}))
		if err != nil {
			t.Fatal(err)
		}
		f.s.Add(&sim.Machine{NodeID: resp.Msg.Node.Id, UUID: uuid, MACs: []string{mac}})
		f.ids = append(f.ids, resp.Msg.Node.Id)
	}
	return f
}

// list lists the nodes, waiting out a server that is restarting.
func (f *fleet) list() []*bcdv1.Node {
	for {
		resp, err := f.nodes.List(f.ctx, connect.NewRequest(&bcdv1.ListNodesRequest{PageSize: 100}))
		if err == nil {
			return resp.Msg.Nodes
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitRest waits until no node is busy, and tells what the busy ones wait for if some still
// are after a while.
func (f *fleet) waitRest(phase string) []*bcdv1.Node {
	t := f.t
	t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		ns := f.list()
		busy := 0
		for _, nd := range ns {
			if nd.TargetState != "" && nd.State != "failed" {
				busy++
			}
		}
		if busy == 0 {
			return ns
		}
		if time.Now().After(deadline) {
			st, _ := store.Open(f.ctx, f.dsn)
			for _, nd := range ns {
				if nd.TargetState == "" || nd.State == "failed" {
					continue
				}
				wfs, _ := st.Workflows(f.ctx, nd.Id, 1)
				for _, w := range wfs {
					t.Logf("%s %s: %s %s step %d attempt %d cmd %s deadline in %ds", nd.Name, nd.State, w.Profile, w.State, w.StepIndex, w.StepAttempt, w.CurrentCommand, (w.StepDeadline-time.Now().UnixMicro())/1e6)
				}
				cmds, _ := st.Commands(f.ctx, nd.Id, 100)
				for _, c := range cmds[max(0, len(cmds)-3):] {
					t.Logf("   %s %s %s agent=%s err=%s", c.ID, c.Kind, c.State, c.TargetAgent, c.Error)
				}
			}
			wk, _ := st.WakeUps(f.ctx, 100)
			t.Logf("wake-ups %+v", wk)
		drain:
			for {
				select {
				case err := <-f.s.Errors():
					t.Logf("simulated agent: %v", err)
				default:
					break drain
				}
			}
			t.Fatalf("%s: %d nodes still busy", phase, busy)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitExecs waits until the simulated agents have run at least min commands.
func (f *fleet) waitExecs(min int) {
	f.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for len(f.s.Executions()) < min {
		if time.Now().After(deadline) {
			f.t.Fatalf("fewer than %d commands ran", min)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f *fleet) deployAll() {
	f.t.Helper()
	for _, id := range f.ids {
		if _, err := f.nodes.Deploy(f.ctx, connect.NewRequest(&bcdv1.DeployRequest{Node: id, Image: "img"})); err != nil {
			f.t.Fatal(err)
		}
	}
}

// check asserts what the killing may not have broken: no command ran twice, a failed node has
// its fault code, at least half the nodes got where they were going (want), no state change is
// missing from the event log, and no step ever had two commands outstanding at once (which two
// reconciliations of one node at the same time would leave behind).
func (f *fleet) check(final []*bcdv1.Node, want string) map[string]int {
	t := f.t
	t.Helper()
	for id, c := range f.s.Executions() {
		if c != 1 {
			t.Errorf("command %s ran %d times", id, c)
		}
	}
	counts := map[string]int{}
	for _, nd := range final {
		counts[nd.State]++
		if nd.State == "failed" && nd.FaultCode == "" {
			t.Errorf("%s failed without a fault code", nd.Name)
		}
	}
	if n := len(f.ids); counts[want]+counts["failed"] != n || counts[want] < n/2 {
		t.Errorf("final states %v", counts)
	}
	st, err := store.Open(f.ctx, f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, id := range f.ids {
		evs, _ := st.Events(f.ctx, store.EventFilter{NodeID: id, Limit: 1000})
		state := ""
		var chain []string
		for _, e := range evs {
			if e.FromState == e.ToState && e.Kind != "node.enroll" {
				continue
			}
			if e.FromState != state {
				t.Errorf("node %s: event %s goes %s → %s after the node was %s (chain %s)", id, e.Kind, e.FromState, e.ToState, state, strings.Join(chain, " "))
			}
			state = e.ToState
			chain = append(chain, state)
		}
		nd, _ := st.Node(f.ctx, id, "")
		if state != nd.State {
			t.Errorf("node %s is %s but its events end in %s", id, nd.State, state)
		}
		cmds, err := st.Commands(f.ctx, id, 1000)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range overlappingCommands(cmds) {
			t.Errorf("node %s: %s", id, e)
		}
	}
	return counts
}

// overlappingCommands lists the steps that had a command created while an earlier command of
// the same step had not ended. Pure.
func overlappingCommands(cmds []store.Command) []string {
	type step struct {
		wf    string
		index int
	}
	by := map[step][]store.Command{}
	for _, c := range cmds {
		if c.WorkflowID == "" {
			continue
		}
		k := step{c.WorkflowID, c.StepIndex}
		by[k] = append(by[k], c)
	}
	var out []string
	for k, cs := range by {
		slices.SortFunc(cs, func(a, b store.Command) int { return int(a.CreatedAt - b.CreatedAt) })
		for i := 1; i < len(cs); i++ {
			prev := cs[i-1]
			if prev.FinishedAt == 0 || prev.FinishedAt > cs[i].CreatedAt {
				out = append(out, fmt.Sprintf("workflow %s step %d: %s (%s) created while %s (%s, %s) had not ended", k.wf, k.index, cs[i].ID, cs[i].Kind, prev.ID, prev.Kind, prev.State))
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestCrashSafety SIGKILLs the server process in the middle of workflows on many nodes, twice,
// and restarts it on the same store, on each engine. The simulated agents live in this process
// and survive, as real ones would. Every node must end where the table says, no command may run
// twice, and no state change may be missing from the event log.
func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) { crashSafety(t, storetest.DSN(t, e)) })
	}
}

func crashSafety(t *testing.T, dsn string) {
	p := newServerProc(t, dsn, testproc.LoopbackAddr(t), testproc.LoopbackAddr(t))
	restart := func() {
		t.Helper()
		p.kill()
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
	}
	restart()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const n = 16
	f := newFleet(t, ctx, "http://"+p.api, p.adminToken(), dsn, p.dir, n)
	// Kill the server while the nodes are between enrolling and ready.
	f.waitExecs(3 * n)
	restart()
	ready := f.waitRest("enroll")
	f.deployAll()
	before := len(f.s.Executions())
	f.waitExecs(before + 3*n)
	restart()
	final := f.waitRest("deploy")
	counts := f.check(final, "deployed")
	t.Logf("after enroll: %d nodes; after deploy with two crashes: %v", len(ready), counts)
}
