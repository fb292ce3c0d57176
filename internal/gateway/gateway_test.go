package gateway_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"bcd/internal/agentlink"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/gen/agentv1/agentv1connect"
	"bcd/internal/pki"
)

func start(t *testing.T) *gatewaytest.Env {
	t.Helper()
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	return gatewaytest.Start(t, gateway.Config{PollInterval: 100 * time.Millisecond})
}

// helloNode opens a stream as generation 1 of node n1 (its certificate issued now) and sends
// its Hello; the stream is closed when the test ends.
func helloNode(t *testing.T, ctx context.Context, env *gatewaytest.Env) *connect.BidiStreamForClient[agentv1.AgentMessage, agentv1.ServerMessage] {
	t.Helper()
	env.Identities.SetGeneration("n1", 1)
	cert := certFor(t, env, func(der []byte) ([]byte, error) { return env.CA.IssueNode(der, "n1", 1, time.Hour, time.Now()) })
	s := rawClient(t, env, cert).Connect(ctx)
	t.Cleanup(func() { _ = s.CloseResponse() })
	if err := s.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{}}}); err != nil {
		t.Fatal(err)
	}
	return s
}

// rawClient is a GatewayService client presenting cert (none when zero).
func rawClient(t *testing.T, env *gatewaytest.Env, cert tls.Certificate) agentv1connect.GatewayServiceClient {
	t.Helper()
	return agentv1connect.NewGatewayServiceClient(httpClient(t, env, cert), env.URL)
}

// httpClient is an HTTP/2 client of the gateway presenting cert (none when zero).
func httpClient(t *testing.T, env *gatewaytest.Env, cert tls.Certificate) *http.Client {
	t.Helper()
	tc := pki.ClientTLSConfig(env.CA.CertPEM(), cert)
	tc.ServerName = "127.0.0.1"
	var p http.Protocols
	p.SetHTTP2(true)
	tr := &http.Transport{TLSClientConfig: tc, Protocols: &p, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// commandsOf is the commands a server message carries: a batch's, or its single command.
func commandsOf(m *agentv1.ServerMessage) []*agentv1.Command {
	if c := m.GetCommand(); c != nil {
		return []*agentv1.Command{c}
	}
	return m.GetBatch().GetCommands()
}

func csr(t *testing.T) (crypto.Signer, []byte) {
	t.Helper()
	key, der, err := pki.NewKeyAndCSR("test")
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func TestJoin(t *testing.T) {
	env := start(t)
	ids := env.Identities
	used := ids.SiteToken("s1", "a-used", time.Hour)
	env.Identities.SetGeneration("n7", 3)
	nodeTok := ids.NodeToken("n7", time.Hour)
	c := rawClient(t, env, tls.Certificate{})
	ctx := context.Background()
	_, usedCSR := csr(t)
	if _, err := c.Join(ctx, connect.NewRequest(&agentv1.JoinRequest{Kind: agentv1.AgentKind_AGENT_KIND_SITE, Token: used, CsrDer: usedCSR})); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		kind     agentv1.AgentKind
		token    string
		badCSR   bool
		code     connect.Code // 0: success
		identity pki.Identity
	}{
		{"site good", agentv1.AgentKind_AGENT_KIND_SITE, ids.SiteToken("s1", "a1", time.Hour), false, 0, pki.SiteAgentIdentity("s1", "a1")},
		{"site reused", agentv1.AgentKind_AGENT_KIND_SITE, used, false, connect.CodeUnauthenticated, pki.Identity{}},
		{"site expired", agentv1.AgentKind_AGENT_KIND_SITE, ids.SiteToken("s1", "a2", -time.Second), false, connect.CodeUnauthenticated, pki.Identity{}},
		{"site unknown", agentv1.AgentKind_AGENT_KIND_SITE, pki.JoinTokenPrefix + strings.Repeat("a", 52), false, connect.CodeUnauthenticated, pki.Identity{}},
		{"site empty token", agentv1.AgentKind_AGENT_KIND_SITE, "", false, connect.CodeUnauthenticated, pki.Identity{}},
		{"node token as site", agentv1.AgentKind_AGENT_KIND_SITE, ids.NodeToken("n8", time.Hour), false, connect.CodeUnauthenticated, pki.Identity{}},
		{"bad csr", agentv1.AgentKind_AGENT_KIND_SITE, ids.SiteToken("s1", "a3", time.Hour), true, connect.CodeInvalidArgument, pki.Identity{}},
		{"no kind", agentv1.AgentKind_AGENT_KIND_UNSPECIFIED, ids.SiteToken("s1", "a4", time.Hour), false, connect.CodeInvalidArgument, pki.Identity{}},
		{"node good", agentv1.AgentKind_AGENT_KIND_NODE, nodeTok, false, 0, pki.NodeIdentity("n7", 3)},
		{"node reused", agentv1.AgentKind_AGENT_KIND_NODE, nodeTok, false, connect.CodeUnauthenticated, pki.Identity{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, der := csr(t)
			if tc.badCSR {
				der = []byte("not a csr")
			}
			resp, err := c.Join(ctx, connect.NewRequest(&agentv1.JoinRequest{
				Kind: tc.kind, Token: tc.token, CsrDer: der,
				Hints: &agentv1.NodeHints{ProductUuid: "u-7", Macs: []string{"52:54:00:00:00:07"}},
			}))
			if tc.code != 0 {
				if connect.CodeOf(err) != tc.code {
					t.Fatalf("err %v, want code %v", err, tc.code)
				}
				if tc.code == connect.CodeUnauthenticated && tc.token != "" && !strings.HasSuffix(err.Error(), string(gateway.ErrTokenRefused)) {
					t.Errorf("refusal says more than %q: %v", gateway.ErrTokenRefused, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(resp.Msg.GetCaPem()) != string(env.CA.CertPEM()) {
				t.Error("CA PEM differs")
			}
			_, id, err := env.CA.Verify(resp.Msg.GetCertDer(), time.Now())
			if err != nil || id != tc.identity {
				t.Fatalf("certificate %v (%v), want %v", id, err, tc.identity)
			}
		})
	}
	if h := ids.Hints("n7"); h.ProductUUID != "u-7" || len(h.MACs) != 1 {
		t.Errorf("hints %+v", h)
	}
}

func TestConnectWithoutCertificateRefused(t *testing.T) {
	env := start(t)
	c := rawClient(t, env, tls.Certificate{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := c.Connect(ctx)
	_ = s.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{}}})
	_, err := s.Receive()
	if connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("err %v, want unauthenticated", err)
	}
	_ = s.CloseRequest()
	_ = s.CloseResponse()
	if n := env.Queue.Counts().Connected; len(n) != 0 {
		t.Errorf("connections recorded: %v", n)
	}
}

// writeIdentity stores a certificate for key in an agentlink DataDir.
func writeIdentity(t *testing.T, env *gatewaytest.Env, key crypto.Signer, der []byte) string {
	t.Helper()
	dir := t.TempDir()
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{agentlink.KeyFile: keyPEM, agentlink.CertFile: pki.EncodeCertPEM(der), agentlink.CAFile: env.CA.CertPEM()} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func linkConfig(env *gatewaytest.Env, dir string) agentlink.Config {
	return agentlink.Config{GatewayURL: env.URL, DataDir: dir, Kind: agentlink.KindNode, MinBackoff: 5 * time.Millisecond}
}

func TestConnectRefusesStaleOrUnknownNodes(t *testing.T) {
	env := start(t)
	for _, tc := range []struct {
		name string
		node string
		gen  uint64
	}{
		{"revoked generation", "n1", 1},
		{"unknown node", "nobody", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env.Identities.SetGeneration("n1", 2)
			key, der := csr(t)
			cert, err := env.CA.IssueNode(der, tc.node, tc.gen, time.Hour, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			l, err := agentlink.Dial(ctx, linkConfig(env, writeIdentity(t, env, key, cert)), agentlink.HandlerFunc(nil))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Wait(); !errors.Is(err, agentlink.ErrRefused) {
				t.Fatalf("link ended with %v, want ErrRefused", err)
			}
		})
	}
	if n := env.Queue.Counts().Connected; len(n) != 0 {
		t.Errorf("connections recorded: %v", n)
	}
}

// A lessee's node-tenant certificate connects, runs plain work, but is never given an
// attested command and cannot send a signature.
func TestTenantNeverAttests(t *testing.T) {
	env := start(t)
	env.Identities.SetGeneration("n1", 1)
	key, der := csr(t)
	cert, err := env.CA.IssueNodeTenant(der, "n1", "t1", 1, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	node := gateway.AgentRef{Kind: pki.KindNode, NodeID: "n1", Generation: 1}
	env.Queue.Enqueue(node,
		gateway.Command{ID: "wipe", Kind: "disk.wipe", NodeID: "n1", Generation: 1},
		gateway.Command{ID: "other-node", Kind: "inventory.refresh", NodeID: "n2", Generation: 1},
		gateway.Command{ID: "plain", Kind: "inventory.refresh", NodeID: "n1", Generation: 1})
	var runs atomic.Int64
	h := agentlink.HandlerFunc(func(context.Context, agentlink.Command, func(agentlink.Progress)) ([]byte, error) {
		runs.Add(1)
		return []byte(`{}`), nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	l, err := agentlink.Dial(ctx, linkConfig(env, writeIdentity(t, env, key, cert)), h)
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := env.Queue.WaitFor(wctx, func(c gatewaytest.Counts) bool { return c.Final == 3 }); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := l.Wait(); err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("%d commands ran, want only the plain one", n)
	}
	for id, want := range map[string]string{"wipe": "node-tenant", "other-node": "offered to"} {
		if e, _ := env.Queue.Get(id); e.State != gatewaytest.Failed || !strings.Contains(e.Final.Error, want) || e.Final.NodeSig != nil {
			t.Errorf("%s: %s %q", id, e.State, e.Final.Error)
		}
	}

	// A signature from a tenant is refused by the gateway itself.
	tlsCert, err := pki.TLSCertificate(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	s := rawClient(t, env, tlsCert).Connect(sctx)
	defer func() { _ = s.CloseResponse() }()
	for _, m := range []*agentv1.AgentMessage{
		{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{}}},
		{Msg: &agentv1.AgentMessage_Update{Update: &agentv1.CommandUpdate{CommandId: "plain", State: agentv1.CommandState_COMMAND_STATE_SUCCEEDED, NodeSig: []byte("sig"), SignerCertDer: cert}}},
	} {
		if err := s.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	m, err := s.Receive()
	if err != nil {
		t.Fatal(err)
	}
	if ua := m.GetUpdateAck(); ua == nil || !strings.Contains(ua.GetError(), "cannot attest") {
		t.Fatalf("got %v, want a refusing update ack", m)
	}
	_ = s.CloseRequest()
	if e, _ := env.Queue.Get("plain"); len(e.Updates) == 0 || e.Final.NodeSig != nil {
		t.Errorf("plain: %+v", e.Final)
	}
}

func TestHelloFirst(t *testing.T) {
	env := start(t)
	key, der := csr(t)
	cert, err := env.CA.IssueSiteAgent(der, "s1", "a1", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tlsCert, err := pki.TLSCertificate(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := rawClient(t, env, tlsCert).Connect(ctx)
	if err := s.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Heartbeat{Heartbeat: &agentv1.Heartbeat{}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Receive(); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("err %v, want invalid argument", err)
	}
	_ = s.CloseRequest()
	_ = s.CloseResponse()
}

// The acknowledgements of one frame are recorded together: one AckAll per lane, not one per
// command; an unknown command among them is refused alone.
func TestAcksOfAFrameAreRecordedTogether(t *testing.T) {
	env := start(t)
	site := gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: "s1", AgentID: "a1"}
	const n, lanes = 400, 64 // the default lanes
	for i := range n {
		env.Queue.Enqueue(site, gateway.Command{ID: fmt.Sprintf("c%03d", i), Kind: "bmc.power"})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := rawClient(t, env, certFor(t, env, func(der []byte) ([]byte, error) {
		return env.CA.IssueSiteAgent(der, "s1", "a1", time.Hour, time.Now())
	})).Connect(ctx)
	defer func() { _ = s.CloseResponse() }()
	if err := s.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{}}}); err != nil {
		t.Fatal(err)
	}
	var acks []*agentv1.CommandAck
	for len(acks) < n {
		m, err := s.Receive()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range commandsOf(m) {
			acks = append(acks, &agentv1.CommandAck{CommandId: c.GetId()})
		}
	}
	acks = append(acks, &agentv1.CommandAck{CommandId: "never-sent"})
	if err := s.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Batch{Batch: &agentv1.AgentBatch{Acks: acks}}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Queue.WaitFor(ctx, func(c gatewaytest.Counts) bool { return c.Acks == n }); err != nil {
		t.Fatalf("acknowledgements recorded: %v", err)
	}
	_ = s.CloseRequest()
	if calls := env.Queue.Counts().AckCalls; calls > lanes {
		t.Errorf("%d acknowledgements of one frame took %d AckAll calls, want at most one per lane (%d)", n+1, calls, lanes)
	}
	for i := range n {
		if e, _ := env.Queue.Get(fmt.Sprintf("c%03d", i)); e.State != gatewaytest.Delivered || e.Acks != 1 {
			t.Errorf("c%03d: %s, %d acks", i, e.State, e.Acks)
		}
	}
}
