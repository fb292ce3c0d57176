package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/gen/agentv1/agentv1connect"
	"bcd/internal/pki"
)

// Environment of TestIdleNodeStreamsMemory.
const (
	memEnv        = "BCD_GATEWAY_MEM"         // number of node agents; unset: the test is skipped
	memResultEnv  = "BCD_GATEWAY_MEM_RESULT"  // bytes of one command result each agent reports first
	memBareEnv    = "BCD_GATEWAY_MEM_BARE"    // set: connections only (TLS and HTTP/2), no stream
	memProfileEnv = "BCD_GATEWAY_MEM_PROFILE" // a directory for heap.pprof and goroutines.txt
	memClientsEnv = "BCD_GATEWAY_MEM_CLIENTS" // set in the child: the file of its agents
)

// memAgents is what the child process needs to connect its agents.
type memAgents struct {
	URL         string
	CAPEM       []byte
	ResultBytes int
	Bare        bool
	Agents      []memAgent
}

type memAgent struct {
	CertDER, KeyPEM []byte
}

// TestIdleNodeStreamsMemory measures what the gateway spends on each idle node-agent stream:
//
//	BCD_GATEWAY_MEM=1000 go test -run TestIdleNodeStreamsMemory -v ./internal/gateway/
//
// (not under -race, which inflates memory). The agents run in a child process (this test
// binary again), each over its own TLS connection as real agents do, so the goroutines, heap
// and stacks counted here are the server's alone: the gateway with its TLS and HTTP/2
// connections, and the fake queue's few hundred bytes per agent. Each agent says hello and
// heartbeats every 10 s; the figures are taken once every stream answered a heartbeat.
//
// BCD_GATEWAY_MEM_RESULT=65536: each agent first reports a result that large (of a command the
// queue does not know: refused, and answered), as an OS agent reports an inventory, and then
// idles: what a stream keeps of a large message. BCD_GATEWAY_MEM_BARE=1: the agents only open
// their connections (one refused Join each), for what TLS and HTTP/2 cost without a stream.
func TestIdleNodeStreamsMemory(t *testing.T) {
	if path := os.Getenv(memClientsEnv); path != "" {
		runMemClients(t, path)
		return
	}
	n, _ := strconv.Atoi(os.Getenv(memEnv))
	if n <= 0 {
		t.Skipf("set %s=N to measure N idle node streams", memEnv)
	}
	if os.Getenv(memProfileEnv) != "" {
		defer func(r int) { runtime.MemProfileRate = r }(runtime.MemProfileRate)
		runtime.MemProfileRate = 1 // every allocation in the heap profile
	}
	env := gatewaytest.Start(t, gateway.Config{})
	result, _ := strconv.Atoi(os.Getenv(memResultEnv))
	spec := memAgents{URL: env.URL, CAPEM: env.CA.CertPEM(), ResultBytes: result, Bare: os.Getenv(memBareEnv) != ""}
	for i := range n {
		node := fmt.Sprintf("n%05d", i)
		env.Identities.SetGeneration(node, 1)
		key, der := csr(t)
		cert, err := env.CA.IssueNode(der, node, 1, time.Hour, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		keyPEM, err := pki.EncodeKeyPEM(key)
		if err != nil {
			t.Fatal(err)
		}
		spec.Agents = append(spec.Agents, memAgent{CertDER: cert, KeyPEM: keyPEM})
	}
	path := filepath.Join(t.TempDir(), "agents.json")
	data, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	bare := spec.Bare
	spec, data = memAgents{}, nil

	before := memSample()
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleNodeStreamsMemory$", "-test.v")
	cmd.Env = append(os.Environ(), memClientsEnv+"="+path)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "agents ready" {
				close(ready)
			}
			fmt.Fprintln(os.Stderr, sc.Text())
		}
	}()
	t.Cleanup(func() {
		_ = stdin.Close() // the child ends its agents and exits
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	select {
	case <-ready:
	case <-time.After(5 * time.Minute):
		t.Fatal("the agents never got ready")
	}
	open := func(c gatewaytest.Counts) int {
		o := 0
		for _, k := range c.Open {
			o += k
		}
		return o
	}
	if !bare {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := env.Queue.WaitFor(ctx, func(c gatewaytest.Counts) bool { return open(c) == n }); err != nil {
			t.Fatalf("waiting for %d open streams (%d): %v", n, open(env.Queue.Counts()), err)
		}
		// Past the agents' first heartbeats (every 10 s), so each stream has answered one.
		time.Sleep(12 * time.Second)
	}
	after := memSample()
	if o := open(env.Queue.Counts()); !bare && o != n {
		t.Fatalf("%d streams open at the end, want %d", o, n)
	}

	what := fmt.Sprintf("%d idle node streams (a %d-byte result reported first)", n, result)
	if bare {
		what = fmt.Sprintf("%d bare agent connections (TLS, HTTP/2, no stream)", n)
	}
	per := func(a, b uint64) float64 { return (float64(a) - float64(b)) / float64(n) / 1024 }
	t.Logf("%s, server side only, each: %.2f goroutines, %.1f KiB live heap, %.1f KiB heap in use, %.1f KiB stack, %.1f KiB heap in use and stack",
		what, float64(after.goroutines-before.goroutines)/float64(n),
		per(after.heapAlloc, before.heapAlloc), per(after.heapInuse, before.heapInuse),
		per(after.stackInuse, before.stackInuse),
		per(after.heapInuse+after.stackInuse, before.heapInuse+before.stackInuse))
	if dir := os.Getenv(memProfileEnv); dir != "" {
		for name, p := range map[string]struct {
			profile string
			debug   int
		}{"heap.pprof": {"heap", 0}, "goroutines.txt": {"goroutine", 1}} {
			f, err := os.Create(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if err := pprof.Lookup(p.profile).WriteTo(f, p.debug); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

type memStats struct {
	goroutines                       int
	heapAlloc, heapInuse, stackInuse uint64
}

// memSample is the process's figures once garbage collections have freed what they can and
// shrunk the goroutines' stacks (each halves at most one at a time).
func memSample() memStats {
	for range 10 {
		runtime.GC()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memStats{goroutines: runtime.NumGoroutine(), heapAlloc: m.HeapAlloc, heapInuse: m.HeapInuse, stackInuse: m.StackInuse}
}

// runMemClients is the child of TestIdleNodeStreamsMemory: it opens every agent's stream, says
// hello and heartbeats every 10 s, as an idle installed OS does, until its stdin closes.
func runMemClients(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec memAgents
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type agentStream = *connect.BidiStreamForClient[agentv1.AgentMessage, agentv1.ServerMessage]
	var (
		mu      sync.Mutex
		streams []agentStream
		wg      sync.WaitGroup
		sem     = make(chan struct{}, 16)
	)
	for _, a := range spec.Agents {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			key, err := pki.ParseKeyPEM(a.KeyPEM)
			if err != nil {
				t.Error(err)
				return
			}
			cert, err := pki.TLSCertificate(a.CertDER, key)
			if err != nil {
				t.Error(err)
				return
			}
			tc := pki.ClientTLSConfig(spec.CAPEM, cert)
			tc.ServerName = "127.0.0.1"
			var p http.Protocols
			p.SetHTTP2(true)
			// As agentlink's transport: HTTP/2 only, pings every heartbeat interval.
			tr := &http.Transport{TLSClientConfig: tc, Protocols: &p, ForceAttemptHTTP2: true,
				HTTP2: &http.HTTP2Config{SendPingTimeout: 10 * time.Second, PingTimeout: 10 * time.Second}}
			client := agentv1connect.NewGatewayServiceClient(&http.Client{Transport: tr}, spec.URL)
			if spec.Bare {
				// Refused (no token), and the connection stays open, idle.
				if _, err := client.Join(ctx, connect.NewRequest(&agentv1.JoinRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Errorf("join: %v", err)
				}
				return
			}
			s := client.Connect(ctx)
			if err := s.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{AgentVersion: "mem"}}}); err != nil {
				t.Error(err)
				return
			}
			if spec.ResultBytes > 0 {
				u := &agentv1.CommandUpdate{CommandId: "mem-result", State: agentv1.CommandState_COMMAND_STATE_SUCCEEDED, ResultJson: bytes.Repeat([]byte("x"), spec.ResultBytes)}
				if err := s.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Update{Update: u}}); err != nil {
					t.Error(err)
					return
				}
			}
			go func() {
				for {
					if _, err := s.Receive(); err != nil {
						return
					}
				}
			}()
			mu.Lock()
			streams = append(streams, s)
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("%d agents connected", len(spec.Agents))
	fmt.Println("agents ready")
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	hb := time.NewTicker(10 * time.Second)
	defer hb.Stop()
	for {
		select {
		case <-stop:
			for _, s := range streams {
				_ = s.CloseRequest()
				_ = s.CloseResponse()
			}
			return
		case <-hb.C:
			for _, s := range streams {
				_ = s.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{SentUnixMs: time.Now().UnixMilli()}}})
			}
		}
	}
}

// An idle stream holds neither a lane goroutine nor a Connect receive buffer: once its agent's
// report is answered, its lane's goroutine ends and its receiver waits on the request body.
func TestIdleStreamHoldsNoLaneNorBuffer(t *testing.T) {
	env := start(t)
	env.Identities.SetGeneration("n1", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := rawClient(t, env, certFor(t, env, func(der []byte) ([]byte, error) {
		return env.CA.IssueNode(der, "n1", 1, time.Hour, time.Now())
	})).Connect(ctx)
	defer func() { _ = s.CloseResponse() }()
	for _, m := range []*agentv1.AgentMessage{
		{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{}}},
		{Msg: &agentv1.AgentMessage_Update{Update: &agentv1.CommandUpdate{CommandId: "unknown", State: agentv1.CommandState_COMMAND_STATE_SUCCEEDED}}},
	} {
		if err := s.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	m, err := s.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if m.GetUpdateAck().GetCommandId() != "unknown" {
		t.Fatalf("got %v, want the update's ack", m)
	}
	for {
		var dump bytes.Buffer
		if err := pprof.Lookup("goroutine").WriteTo(&dump, 2); err != nil {
			t.Fatal(err)
		}
		lane, waiting := false, false
		for g := range bytes.SplitSeq(dump.Bytes(), []byte("\n\n")) {
			lane = lane || bytes.Contains(g, []byte("gateway.(*session).lane("))
			waiting = waiting || bytes.Contains(g, []byte("gateway.(*session).receive(")) && bytes.Contains(g, []byte("gateway.(*streamBody).wait("))
		}
		if !lane && waiting {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("idle stream: a lane goroutine %v, the receiver waiting on the body %v:\n%s", lane, waiting, dump.Bytes())
		case <-time.After(10 * time.Millisecond):
		}
	}
	_ = s.CloseRequest()
}
