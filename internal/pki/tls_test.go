package pki

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

type handshakeResult struct {
	id  Identity
	ok  bool
	err error
}

// serveOnce accepts one TLS connection on 127.0.0.1 and reports what the server saw.
func serveOnce(t *testing.T, cfg *tls.Config) (string, <-chan handshakeResult) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan handshakeResult, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			out <- handshakeResult{err: err}
			return
		}
		tc := tls.Server(conn, cfg)
		defer tc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tc.HandshakeContext(ctx); err != nil {
			out <- handshakeResult{err: err}
			return
		}
		st := tc.ConnectionState()
		id, ok := IdentityFromTLS(&st)
		_, err = tc.Write([]byte("k"))
		out <- handshakeResult{id: id, ok: ok, err: err}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), out
}

// dial connects, completes the handshake and reads the server's one byte, which surfaces a
// server-side refusal of the client certificate (TLS 1.3 reports it after the client's flight).
func dial(addr string, cfg *tls.Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := &tls.Dialer{Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadFull(conn, make([]byte, 1))
	return err
}

func clientCert(t *testing.T, is issued) tls.Certificate {
	t.Helper()
	c, err := TLSCertificate(is.cert, is.key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestMTLSHandshake(t *testing.T) {
	now := time.Now()
	ca, err := CreateCA("tls CA", now.Add(-24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	other, err := CreateCA("tls CA", now.Add(-24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.IssueServer([]string{"localhost", "127.0.0.1", "::1"}, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	serverCfg, err := ServerTLSConfig(ca, certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	site := issueAt(t, ca, SiteAgentIdentity("s1", "a1"), time.Hour, now)
	node := issueAt(t, ca, NodeIdentity("n1", 3), time.Hour, now)
	tenant := issueAt(t, ca, NodeTenantIdentity("n1", "acme", 3), time.Hour, now)
	foreign := issueAt(t, other, NodeIdentity("n1", 3), time.Hour, now)
	expired := issueAt(t, ca, NodeIdentity("n1", 3), time.Hour, now.Add(-2*time.Hour))

	tests := []struct {
		name       string
		caPEM      []byte
		cert       tls.Certificate
		wantID     Identity
		wantOK     bool
		clientFail bool
		serverFail bool
	}{
		{"site agent", ca.CertPEM(), clientCert(t, site), SiteAgentIdentity("s1", "a1"), true, false, false},
		{"node", ca.CertPEM(), clientCert(t, node), NodeIdentity("n1", 3), true, false, false},
		{"node tenant", ca.CertPEM(), clientCert(t, tenant), NodeTenantIdentity("n1", "acme", 3), true, false, false},
		{"no client certificate (join)", ca.CertPEM(), tls.Certificate{}, Identity{}, false, false, false},
		{"client certificate of another CA", ca.CertPEM(), clientCert(t, foreign), Identity{}, false, true, true},
		{"expired client certificate", ca.CertPEM(), clientCert(t, expired), Identity{}, false, true, true},
		{"client trusts another CA", other.CertPEM(), clientCert(t, node), Identity{}, false, true, true},
		{"client trusts nothing", nil, tls.Certificate{}, Identity{}, false, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr, res := serveOnce(t, serverCfg)
			clientErr := dial(addr, ClientTLSConfig(tt.caPEM, tt.cert))
			r := <-res
			if (clientErr != nil) != tt.clientFail {
				t.Fatalf("client error = %v, want failure %v", clientErr, tt.clientFail)
			}
			if (r.err != nil) != tt.serverFail {
				t.Fatalf("server error = %v, want failure %v", r.err, tt.serverFail)
			}
			if r.ok != tt.wantOK || r.id != tt.wantID {
				t.Fatalf("server saw %+v (ok %v), want %+v (ok %v)", r.id, r.ok, tt.wantID, tt.wantOK)
			}
		})
	}
}

func TestMTLSRefusesTLS12(t *testing.T) {
	now := time.Now()
	ca, _ := CreateCA("tls CA", now.Add(-24*time.Hour))
	certPEM, keyPEM, _ := ca.IssueServer([]string{"127.0.0.1"}, time.Hour, now)
	serverCfg, err := ServerTLSConfig(ca, certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	addr, res := serveOnce(t, serverCfg)
	cfg := ClientTLSConfig(ca.CertPEM(), tls.Certificate{})
	cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	if err := dial(addr, cfg); err == nil {
		t.Fatal("TLS 1.2 client accepted")
	}
	if r := <-res; r.err == nil {
		t.Fatal("server accepted TLS 1.2")
	}
}

// A certificate of the right CA, usable for TLS servers, that does not carry the bcd server
// identity (here a node's) is refused by agents.
func TestClientRefusesNonServerIdentity(t *testing.T) {
	now := time.Now()
	ca, _ := CreateCA("tls CA", now.Add(-24*time.Hour))
	key, _, err := NewKeyAndCSR("")
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(NodeIdentity("n1", 1).URI())
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(42),
		Subject:      pkix.Name{CommonName: "impostor"},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		URIs:         []*url.URL{u},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.signer().cert, key.Public(), ca.signer().key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := EncodeKeyPEM(key)
	serverCfg, err := ServerTLSConfig(ca, EncodeCertPEM(der), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	addr, res := serveOnce(t, serverCfg)
	err = dial(addr, ClientTLSConfig(ca.CertPEM(), tls.Certificate{}))
	<-res
	if err == nil || !strings.Contains(err.Error(), "not the bcd server") {
		t.Fatalf("client error = %v, want a refusal of the node identity", err)
	}
}

func TestIdentityFromTLSWithoutVerifiedChains(t *testing.T) {
	now := time.Now()
	ca, _ := CreateCA("tls CA", now.Add(-24*time.Hour))
	node := issueAt(t, ca, NodeIdentity("n1", 1), time.Hour, now)
	cert, _ := x509.ParseCertificate(node.cert)
	for name, st := range map[string]*tls.ConnectionState{
		"nil":                         nil,
		"empty":                       {},
		"peer certificate unverified": {PeerCertificates: []*x509.Certificate{cert}},
		"empty chain":                 {VerifiedChains: [][]*x509.Certificate{{}}},
	} {
		if id, ok := IdentityFromTLS(st); ok {
			t.Errorf("%s: identity %+v without a verified chain", name, id)
		}
	}
	if id, ok := IdentityFromTLS(&tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}); !ok || id != NodeIdentity("n1", 1) {
		t.Fatalf("verified chain: %+v %v", id, ok)
	}
}

func TestTLSConfigInputs(t *testing.T) {
	now := time.Now()
	ca, _ := CreateCA("tls CA", now.Add(-24*time.Hour))
	certPEM, keyPEM, _ := ca.IssueServer([]string{"127.0.0.1"}, time.Hour, now)
	if _, err := ServerTLSConfig(nil, certPEM, keyPEM); err == nil {
		t.Error("nil CA accepted")
	}
	_, otherKey, _ := ca.IssueServer([]string{"127.0.0.1"}, time.Hour, now)
	_, err := ServerTLSConfig(ca, certPEM, otherKey)
	if err == nil {
		t.Error("mismatched server key accepted")
	} else {
		assertNoKeyMaterial(t, err.Error(), keyPEM, otherKey)
	}
	node := issueAt(t, ca, NodeIdentity("n1", 1), time.Hour, now)
	site := issueAt(t, ca, SiteAgentIdentity("s", "a"), time.Hour, now)
	if _, err := TLSCertificate(node.cert, site.key); err == nil {
		t.Error("TLSCertificate accepted a key that does not match")
	}
	if _, err := TLSCertificate([]byte("junk"), site.key); err == nil {
		t.Error("TLSCertificate accepted garbage")
	}
	cfg := ClientTLSConfig(ca.CertPEM(), tls.Certificate{})
	if cfg.MinVersion != tls.VersionTLS13 || len(cfg.Certificates) != 0 {
		t.Fatalf("client config: min %x, %d certificates", cfg.MinVersion, len(cfg.Certificates))
	}
}
