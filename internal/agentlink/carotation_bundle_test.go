package agentlink_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/agentlink"
	"bcd/internal/gateway/gatewaytest"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/gen/agentv1/agentv1connect"
	"bcd/internal/pki"
)

// bundleGateway answers Renew with a certificate its CA renews and the CA bundle the test gives
// (what a broken or hostile gateway could send); it serves nothing else.
type bundleGateway struct {
	agentv1connect.UnimplementedGatewayServiceHandler
	ca     *pki.CA
	cert   []byte // the agent's certificate, renewed at every call
	bundle []byte
}

func (g *bundleGateway) Renew(context.Context, *connect.Request[agentv1.RenewRequest]) (*connect.Response[agentv1.RenewResponse], error) {
	der, err := g.ca.Renew(g.cert, time.Hour, time.Now())
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&agentv1.RenewResponse{CertDer: der, CaPem: g.bundle}), nil
}

// Join answers with a site agent certificate for the CSR and the test's CA bundle.
func (g *bundleGateway) Join(_ context.Context, req *connect.Request[agentv1.JoinRequest]) (*connect.Response[agentv1.JoinResponse], error) {
	der, err := g.ca.IssueSiteAgent(req.Msg.GetCsrDer(), "s1", "a1", time.Hour, time.Now())
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&agentv1.JoinResponse{CertDer: der, CaPem: g.bundle}), nil
}

// A join answer's CA bundle is taken as a renewal's is: the agent's CA file holds it only when
// it is one or two CA certificates, one of which issued the agent's certificate; else the CA
// the agent joined with.
func TestJoinAnswerBundle(t *testing.T) {
	ca, err := pki.CreateCA("bcd test CA", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	next, err := pki.CreateCA("bcd test CA 2", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := next.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	rotation := append(ca.CertPEM(), next.CertPEM()...)
	for _, tc := range []struct {
		name   string
		bundle []byte
		taken  bool
	}{
		{"the rotation's two CAs", rotation, true},
		{"a CA's private key inside", append(bytes.Clone(rotation), keyPEM...), false},
		{"text around", append([]byte("trust me\n"), rotation...), false},
		{"a CA that did not issue it", next.CertPEM(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := serveGateway(t, ca, &bundleGateway{ca: ca, bundle: tc.bundle})
			dir := t.TempDir()
			ctx, cancel := context.WithCancel(context.Background())
			l, err := agentlink.Dial(ctx, agentlink.Config{GatewayURL: url, DataDir: dir, Kind: agentlink.KindSite, CAPEM: ca.CertPEM(), JoinToken: "bcds_test",
				MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, agentlink.HandlerFunc(nil))
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			stop(t, cancel, l)
			got, err := os.ReadFile(filepath.Join(dir, agentlink.CAFile))
			if err != nil {
				t.Fatal(err)
			}
			want := ca.CertPEM()
			if tc.taken {
				want = tc.bundle
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("the CA file holds %d CAs (%d bytes), want %d bytes (taken: %v)", len(pki.BundleFingerprints(got)), len(got), len(want), tc.taken)
			}
		})
	}
}

// A renewal answer's CA bundle becomes the agent's CA file (what its site passes to ramdisks as
// bcd.ca) only when it is one or two CA certificates and nothing else, one of which issued the
// renewed certificate; otherwise the agent keeps its CA file, and the renewed certificate.
func TestRenewalAnswerBundle(t *testing.T) {
	ca, err := pki.CreateCA("bcd test CA", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	next, err := pki.CreateCA("bcd test CA 2", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	other, err := pki.CreateCA("bcd other CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := next.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	key, csr, err := pki.NewKeyAndCSR("agent")
	if err != nil {
		t.Fatal(err)
	}
	// Two thirds of its hour have passed: the agent renews as soon as it starts.
	certDER, err := ca.IssueSiteAgent(csr, "s1", "a1", time.Hour, time.Now().Add(-50*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	rotation := append(next.CertPEM(), ca.CertPEM()...)
	for _, tc := range []struct {
		name   string
		bundle []byte
		taken  bool
	}{
		{"the rotation's two CAs", rotation, true},
		{"another CA beside its own", append(ca.CertPEM(), other.CertPEM()...), true},
		{"three CAs", append(append(next.CertPEM(), ca.CertPEM()...), other.CertPEM()...), false},
		{"a CA's private key inside", append(bytes.Clone(rotation), keyPEM...), false},
		{"a leaf inside", append(bytes.Clone(rotation), pki.EncodeCertPEM(certDER)...), false},
		{"text around", append([]byte("trust me\n"), rotation...), false},
		{"CAs that did not issue it", append(next.CertPEM(), other.CertPEM()...), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &bundleGateway{ca: ca, cert: certDER, bundle: tc.bundle}
			url := serveGateway(t, ca, g)
			dir := t.TempDir()
			kp, err := pki.EncodeKeyPEM(key)
			if err != nil {
				t.Fatal(err)
			}
			for name, data := range map[string][]byte{agentlink.KeyFile: kp, agentlink.CertFile: pki.EncodeCertPEM(certDER), agentlink.CAFile: ca.CertPEM()} {
				if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			l, err := agentlink.Dial(ctx, agentlink.Config{GatewayURL: url, DataDir: dir, Kind: agentlink.KindSite, MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}, agentlink.HandlerFunc(nil))
			if err != nil {
				cancel()
				t.Fatal(err)
			}
			poll(t, 10*time.Second, "the renewal", func() bool { return !bytes.Equal(l.CertDER(), certDER) })
			stop(t, cancel, l)
			got, err := os.ReadFile(filepath.Join(dir, agentlink.CAFile))
			if err != nil {
				t.Fatal(err)
			}
			want := ca.CertPEM()
			if tc.taken {
				want = tc.bundle
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("the CA file holds %d CAs (%d bytes), want %d bytes (taken: %v)", len(pki.BundleFingerprints(got)), len(got), len(want), tc.taken)
			}
			if bytes.Contains(got, []byte("PRIVATE KEY")) {
				t.Fatal("the CA file holds a private key")
			}
		})
	}
}

// serveGateway serves h over TLS 1.3 on loopback with a server certificate of ca until the
// test ends, and returns its URL.
func serveGateway(t *testing.T, ca *pki.CA, h agentv1connect.GatewayServiceHandler) string {
	t.Helper()
	path, handler := agentv1connect.NewGatewayServiceHandler(h)
	return gatewaytest.Serve(t, ca, path, handler)
}
