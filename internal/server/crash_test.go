package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/auth"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/server"
	"bcd/internal/sim"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestServerProcess is the child of TestCrashSafety: a bcd server on fixed ports that runs
// until it is killed. It does nothing in a normal test run.
func TestServerProcess(t *testing.T) {
	dir := os.Getenv("BCD_CRASH_CHILD_DIR")
	if dir == "" {
		t.Skip("child process of TestCrashSafety only")
	}
	srv, err := server.New(context.Background(), server.Config{Listen: os.Getenv("BCD_CRASH_API"), GatewayListen: os.Getenv("BCD_CRASH_GATEWAY"), DataDir: dir,
		StoreDSN: os.Getenv("BCD_CRASH_STORE")},
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

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
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
	dir := t.TempDir()
	apiAddr, gwAddr := freePort(t), freePort(t)
	var child *exec.Cmd
	startServer := func() {
		t.Helper()
		child = exec.Command(os.Args[0], "-test.run=^TestServerProcess$", "-test.count=1")
		child.Env = append(os.Environ(), "BCD_CRASH_CHILD_DIR="+dir, "BCD_CRASH_API="+apiAddr, "BCD_CRASH_GATEWAY="+gwAddr, "BCD_CRASH_STORE="+dsn)
		child.Stdout, child.Stderr = io.Discard, io.Discard
		if err := child.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := http.Get("http://" + apiAddr + "/healthz")
			if err == nil {
				resp.Body.Close()
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("server did not start: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	kill := func() {
		t.Helper()
		child.Process.Signal(syscall.SIGKILL)
		child.Wait()
	}
	startServer()
	defer kill()
	tokb, err := os.ReadFile(filepath.Join(dir, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	auth := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			r.Header().Set("Authorization", "Bearer "+string(tokb))
			return next(ctx, r)
		}
	}))
	base := "http://" + apiAddr
	nodes := bcdv1connect.NewNodeServiceClient(http.DefaultClient, base, auth)
	inv := bcdv1connect.NewInventoryServiceClient(http.DefaultClient, base, auth)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	jt, err := inv.CreateSiteJoinToken(ctx, connect.NewRequest(&bcdv1.CreateSiteJoinTokenRequest{Site: "default"}))
	if err != nil {
		t.Fatal(err)
	}
	sites, _ := inv.ListSites(ctx, connect.NewRequest(&bcdv1.ListSitesRequest{}))
	s := sim.New(sim.Config{SiteID: sites.Msg.Sites[0].Id, Gateway: &sim.GatewayTarget{URL: jt.Msg.GatewayUrl, CAPEM: []byte(jt.Msg.CaPem), DataDir: filepath.Join(dir, "os")}}, nil)
	agentCtx, stopAgents := context.WithCancel(ctx)
	link, err := s.RunSiteAgentOverGateway(agentCtx, jt.Msg.Token, filepath.Join(dir, "site-agent"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stopAgents(); link.Wait(); s.Wait() }()
	const n = 16
	var ids []string
	for i := range n {
		mac, uuid := fmt.Sprintf("02:cc:00:00:00:%02x", i), fmt.Sprintf("%08x-2222-4333-8444-555555555555", i)
		resp, err := nodes.Enroll(ctx, connect.NewRequest(&bcdv1.EnrollRequest{Name: fmt.Sprintf("c-%d", i), Pool: "default", Macs: []string{mac}, ProductUuid: uuid,
			Bmc: &bcdv1.BmcCredentials{Address: "https://10.30.0.1", Username: "root", Password: "crash-test-password"}}))
		if err != nil {
			t.Fatal(err)
		}
		s.Add(&sim.Machine{NodeID: resp.Msg.Node.Id, UUID: uuid, MACs: []string{mac}})
		ids = append(ids, resp.Msg.Node.Id)
	}
	list := func() []*bcdv1.Node {
		for {
			resp, err := nodes.List(ctx, connect.NewRequest(&bcdv1.ListNodesRequest{PageSize: 100}))
			if err == nil {
				return resp.Msg.Nodes
			}
			time.Sleep(50 * time.Millisecond) // the server is restarting
		}
	}
	waitRest := func(phase string) []*bcdv1.Node {
		deadline := time.Now().Add(120 * time.Second)
		for {
			ns := list()
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
				st, _ := store.Open(ctx, dsn)
				for _, nd := range ns {
					if nd.TargetState == "" || nd.State == "failed" {
						continue
					}
					wfs, _ := st.Workflows(ctx, nd.Id, 1)
					for _, w := range wfs {
						t.Logf("%s %s: %s %s step %d attempt %d cmd %s deadline in %ds", nd.Name, nd.State, w.Profile, w.State, w.StepIndex, w.StepAttempt, w.CurrentCommand, (w.StepDeadline-time.Now().UnixMicro())/1e6)
					}
					cmds, _ := st.Commands(ctx, nd.Id, 100)
					for _, c := range cmds[max(0, len(cmds)-3):] {
						t.Logf("   %s %s %s agent=%s err=%s", c.ID, c.Kind, c.State, c.TargetAgent, c.Error)
					}
				}
				wk, _ := st.WakeUps(ctx, 100)
				t.Logf("wake-ups %+v", wk)
			drain:
				for {
					select {
					case err := <-s.Errors():
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
	// Kill the server while the nodes are between enrolling and ready.
	waitExecs := func(min int) {
		deadline := time.Now().Add(60 * time.Second)
		for len(s.Executions()) < min {
			if time.Now().After(deadline) {
				t.Fatalf("fewer than %d commands ran", min)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitExecs(3 * n)
	kill()
	startServer()
	ready := waitRest("enroll")
	for _, id := range ids {
		if _, err := nodes.Deploy(ctx, connect.NewRequest(&bcdv1.DeployRequest{Node: id, Image: "img"})); err != nil {
			t.Fatal(err)
		}
	}
	before := len(s.Executions())
	waitExecs(before + 3*n)
	kill()
	startServer()
	final := waitRest("deploy")

	for id, c := range s.Executions() {
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
	t.Logf("after enroll: %d nodes; after deploy with two crashes: %v", len(ready), counts)
	if counts["deployed"]+counts["failed"] != n || counts["deployed"] < n/2 {
		t.Errorf("final states %v", counts)
	}
	// No event lost: every node's state changes form an unbroken chain.
	st, err := store.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, id := range ids {
		evs, _ := st.Events(ctx, store.EventFilter{NodeID: id, Limit: 1000})
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
		nd, _ := st.Node(ctx, id, "")
		if state != nd.State {
			t.Errorf("node %s is %s but its events end in %s", id, nd.State, state)
		}
	}
}
