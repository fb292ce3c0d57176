package gateway_test

import (
	"context"
	"crypto/tls"
	"maps"
	"net"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/gen/agentv1/agentv1connect"
	"bcd/internal/pki"
)

// waitStats polls the gateway's counts until cond holds (the server counts a connection's
// close and a stream's end after the client has moved on), or fails the test saying what it
// last saw.
func waitStats(t *testing.T, env *gatewaytest.Env, what string, cond func(gateway.Stats) bool) gateway.Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := env.Server.Stats()
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the gateway's counts are %+v", what, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The gateway counts what it served: joins by kind and those refused, streams open and
// admitted by their certificate's kind and those refused, the commands it sent and the
// updates it received, its connections, and those that never completed a TLS handshake.
func TestStatsCountWhatTheGatewayServed(t *testing.T) {
	env := start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if st := env.Server.Stats(); st.Connections != 0 || st.JoinsRefused != 0 || st.Joins["site-agent"] != 0 || st.Streams["node"] != 0 {
		t.Fatalf("a new gateway's counts: %+v", st)
	}

	// Joins: one of each kind, and two refused (a used token, no token).
	anonHTTP := httpClient(t, env, tls.Certificate{})
	anon := agentv1connect.NewGatewayServiceClient(anonHTTP, env.URL)
	siteTok := env.Identities.SiteToken("s1", "a1", time.Hour)
	env.Identities.SetGeneration("n1", 1)
	for _, j := range []struct {
		kind  agentv1.AgentKind
		token string
		ok    bool
	}{
		{agentv1.AgentKind_AGENT_KIND_SITE, siteTok, true},
		{agentv1.AgentKind_AGENT_KIND_SITE, siteTok, false}, // used
		{agentv1.AgentKind_AGENT_KIND_NODE, env.Identities.NodeToken("n1", time.Hour), true},
		{agentv1.AgentKind_AGENT_KIND_NODE, "", false},
	} {
		_, der := csr(t)
		_, err := anon.Join(ctx, connect.NewRequest(&agentv1.JoinRequest{Kind: j.kind, Token: j.token, CsrDer: der}))
		if (err == nil) != j.ok {
			t.Fatalf("join %v with %q: %v, want success %v", j.kind, j.token, err, j.ok)
		}
	}
	st := env.Server.Stats()
	if want := map[string]int64{"site-agent": 1, "node": 1}; !maps.Equal(st.Joins, want) || st.JoinsRefused != 2 {
		t.Errorf("joins %v, %d refused: want %v, 2 refused", st.Joins, st.JoinsRefused, want)
	}

	// A stream without a certificate is refused; a site agent's is admitted, gets a command
	// and reports it.
	refused := anon.Connect(ctx)
	_ = refused.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{}}})
	if _, err := refused.Receive(); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("a stream without a certificate: %v, want unauthenticated", err)
	}
	_ = refused.CloseRequest()
	_ = refused.CloseResponse()
	site := gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: "s1", AgentID: "a1"}
	env.Queue.Enqueue(site, gateway.Command{ID: "c1", Kind: "bmc.power"})
	siteHTTP := httpClient(t, env, certFor(t, env, func(der []byte) ([]byte, error) {
		return env.CA.IssueSiteAgent(der, "s1", "a1", time.Hour, time.Now())
	}))
	s := agentv1connect.NewGatewayServiceClient(siteHTTP, env.URL).Connect(ctx)
	if err := s.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{}}}); err != nil {
		t.Fatal(err)
	}
	for got := false; !got; {
		m, err := s.Receive()
		if err != nil {
			t.Fatal(err)
		}
		got = len(commandsOf(m)) > 0
	}
	// The command is counted once its write returns, which may be after the agent read it.
	st = waitStats(t, env, "while a site agent's stream is open", func(st gateway.Stats) bool {
		return st.Streams["site-agent"] == 1 && st.CommandsSent == 1
	})
	if st.StreamsOpened["site-agent"] != 1 || st.StreamsRefused != 1 || st.CommandsSent != 1 || st.Streams["node"] != 0 {
		t.Errorf("streams open %v, opened %v, %d refused, %d commands sent: want a site agent's open and opened, 1 refused, 1 sent",
			st.Streams, st.StreamsOpened, st.StreamsRefused, st.CommandsSent)
	}
	for _, m := range []*agentv1.AgentMessage{
		{Msg: &agentv1.AgentMessage_Batch{Batch: &agentv1.AgentBatch{Acks: []*agentv1.CommandAck{{CommandId: "c1"}}}}},
		{Msg: &agentv1.AgentMessage_Update{Update: &agentv1.CommandUpdate{CommandId: "c1", State: agentv1.CommandState_COMMAND_STATE_SUCCEEDED}}},
	} {
		if err := s.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	waitStats(t, env, "after the agent's result", func(st gateway.Stats) bool { return st.Updates == 1 })
	_ = s.CloseRequest()
	_ = s.CloseResponse()
	waitStats(t, env, "after the stream ended", func(st gateway.Stats) bool { return st.Streams["site-agent"] == 0 })

	// A client that presents a certificate another CA signed never completes its handshake,
	// nor does one that connects and says nothing.
	other, err := pki.CreateCA("another CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, der := csr(t)
	foreign, err := other.IssueSiteAgent(der, "s1", "a9", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tc := pki.ClientTLSConfig(env.CA.CertPEM(), tls.Certificate{})
	tc.ServerName = "127.0.0.1"
	// (Go's client sends no certificate the server did not name a CA of: this one insists.)
	tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &tls.Certificate{Certificate: [][]byte{foreign}, PrivateKey: key}, nil
	}
	addr := env.URL[len("https://"):]
	if c, err := tls.Dial("tcp", addr, tc); err == nil {
		// (TLS 1.3: the client learns of the refusal at its first read.)
		_, err = c.Read(make([]byte, 1))
		c.Close()
		if err == nil {
			t.Fatal("a certificate of another CA was accepted")
		}
	}
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	raw.Close()
	anonHTTP.CloseIdleConnections()
	siteHTTP.CloseIdleConnections()
	st = waitStats(t, env, "after the failed handshakes", func(st gateway.Stats) bool { return st.TLSFailures == 2 })
	if st.Connections < 4 {
		t.Errorf("%d connections accepted: want at least 4 (the anonymous client's, the site agent's, the two refused)", st.Connections)
	}
	waitStats(t, env, "once every client closed", func(st gateway.Stats) bool { return st.OpenConnections == 0 })
}
