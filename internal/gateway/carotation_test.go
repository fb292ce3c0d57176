package gateway_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/gen/agentv1/agentv1connect"
	"bcd/internal/pki"
)

// bundleClient is a GatewayService client trusting the CAs of bundle and presenting cert; its
// calls share one connection (HTTP/2), whose certificate is its handshake's.
func bundleClient(t *testing.T, env *gatewaytest.Env, bundle []byte, cert tls.Certificate) agentv1connect.GatewayServiceClient {
	cl, _ := resumingClient(t, env, bundle, cert, nil)
	return cl
}

// resumingClient is bundleClient resuming TLS sessions from cache (nil: none); its transport
// is returned to close its connections.
func resumingClient(t *testing.T, env *gatewaytest.Env, bundle []byte, cert tls.Certificate, cache tls.ClientSessionCache) (agentv1connect.GatewayServiceClient, *http.Transport) {
	t.Helper()
	tc := pki.ClientTLSConfig(bundle, cert)
	tc.ServerName = "127.0.0.1"
	tc.ClientSessionCache = cache
	var p http.Protocols
	p.SetHTTP2(true)
	tr := &http.Transport{TLSClientConfig: tc, Protocols: &p, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return agentv1connect.NewGatewayServiceClient(&http.Client{Transport: tr}, env.URL), tr
}

// Once a rotation of the agent CA finished, a certificate of the retired CA is refused on a
// connection opened while that CA was trusted: every unary call (a renewal: it cannot renew
// itself back into trust) and the open stream, which ends at the gateway's next re-check, each
// saying that the CA is no longer trusted. A new connection presenting it fails its handshake;
// the certificate the rotation's overlap renewed is admitted.
func TestRetiredCAOnOpenConnection(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 100 * time.Millisecond, RecheckInterval: 50 * time.Millisecond})
	oldPEM := env.CA.CertPEM()
	next, err := pki.CreateCA("bcd test CA 2", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	both := append(next.CertPEM(), oldPEM...)

	key, csrDER := csr(t)
	oldDER, err := env.CA.IssueSiteAgent(csrDER, "s1", "a1", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	oldCert, err := pki.TLSCertificate(oldDER, key)
	if err != nil {
		t.Fatal(err)
	}

	// Staged: the agent fetched the next CA; it opens its stream with its old certificate.
	if err := env.CA.SetRotation(env.CA, next, nil); err != nil {
		t.Fatal(err)
	}
	cl := bundleClient(t, env, both, oldCert)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream := cl.Connect(ctx)
	t.Cleanup(func() { _ = stream.CloseRequest(); _ = stream.CloseResponse() })
	if err := stream.Send(&agentv1.AgentMessage{Msg: &agentv1.AgentMessage_Hello{Hello: &agentv1.Hello{AgentVersion: "test", CaSha256: pki.BundleFingerprints(both)}}}); err != nil {
		t.Fatal(err)
	}
	site := gatewaytest.AgentKey(gateway.AgentRef{Kind: pki.KindSiteAgent, AgentID: "a1", SiteID: "s1"})
	for env.Queue.Counts().Open[site] != 1 {
		select {
		case <-ctx.Done():
			t.Fatal("the stream never opened")
		case <-time.After(5 * time.Millisecond):
		}
	}

	// Overlap: the old CA is still trusted; the agent renews with the new one on this connection.
	if err := env.CA.SetRotation(next, nil, oldPEM); err != nil {
		t.Fatal(err)
	}
	resp, err := cl.Renew(ctx, connect.NewRequest(&agentv1.RenewRequest{}))
	if err != nil {
		t.Fatalf("renewing a certificate of the previous CA during the overlap: %v", err)
	}
	renewed, err := x509.ParseCertificate(resp.Msg.GetCertDer())
	if err != nil {
		t.Fatal(err)
	}
	if got := pki.IssuerInBundle(renewed, next.CertPEM()); got != next.Fingerprint() {
		t.Fatalf("the renewed certificate's issuer is %q, want the new CA", got)
	}

	// A client that keeps TLS sessions holds one from the overlap, to resume after the finish.
	cache := tls.NewLRUClientSessionCache(4)
	resumer, resumerTr := resumingClient(t, env, both, oldCert, cache)
	for range 2 { // the session ticket arrives after the handshake: the second call has read it
		if _, err := resumer.Renew(ctx, connect.NewRequest(&agentv1.RenewRequest{})); err != nil {
			t.Fatalf("renewing during the overlap: %v", err)
		}
	}
	resumerTr.CloseIdleConnections()

	// Finished: only the new CA is trusted.
	if err := env.CA.SetRotation(next, nil, nil); err != nil {
		t.Fatal(err)
	}
	_, err = cl.Renew(ctx, connect.NewRequest(&agentv1.RenewRequest{}))
	if connect.CodeOf(err) != connect.CodeUnauthenticated || !strings.Contains(err.Error(), "no longer trusted") {
		t.Fatalf("renewing a retired CA's certificate on an open connection: %v, want unauthenticated, CA no longer trusted", err)
	}
	for {
		_, err := stream.Receive()
		if err == nil {
			continue // heartbeat answers, if any
		}
		if connect.CodeOf(err) != connect.CodeUnauthenticated || !strings.Contains(err.Error(), "no longer trusted") {
			t.Fatalf("the open stream ended with %v, want unauthenticated, CA no longer trusted", err)
		}
		break
	}
	if n := env.Queue.Counts().Open[site]; n != 0 {
		t.Fatalf("%d streams still open", n)
	}

	// A new connection with the retired CA's certificate does not get past its handshake; the
	// renewed certificate is admitted.
	if _, err := bundleClient(t, env, next.CertPEM(), oldCert).Renew(ctx, connect.NewRequest(&agentv1.RenewRequest{})); err == nil {
		t.Fatal("a new connection with a retired CA's certificate was admitted")
	}
	// Nor does one resuming a TLS session of the overlap, which carries the certificate verified
	// then: refused at its handshake, or at its first call.
	if _, err := resumer.Renew(ctx, connect.NewRequest(&agentv1.RenewRequest{})); err == nil {
		t.Fatal("a connection resuming a session of the overlap was admitted with a retired CA's certificate")
	}
	renewedCert, err := pki.TLSCertificate(resp.Msg.GetCertDer(), key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bundleClient(t, env, next.CertPEM(), renewedCert).Renew(ctx, connect.NewRequest(&agentv1.RenewRequest{})); err != nil {
		t.Fatalf("the renewed certificate: %v", err)
	}
}
