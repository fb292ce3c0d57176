package pki

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"sync"
	"testing"
	"time"
)

func TestRenewAt(t *testing.T) {
	for _, tc := range []struct {
		name     string
		issued   time.Time
		lifetime time.Duration
		want     time.Time
	}{
		{"90 days: after 60", t0(), 90 * 24 * time.Hour, t0().Add(60 * 24 * time.Hour)},
		{"7 days: after 4 days 16 hours", t0(), 7 * 24 * time.Hour, t0().Add(112 * time.Hour)},
		{"3 seconds: after 2", t0(), 3 * time.Second, t0().Add(2 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nb, na := tc.issued.Add(-ClockSkew), tc.issued.Add(tc.lifetime)
			if got := Lifetime(nb, na); got != tc.lifetime {
				t.Fatalf("Lifetime = %s, want %s", got, tc.lifetime)
			}
			if got := RenewAt(nb, na); !got.Equal(tc.want) {
				t.Fatalf("RenewAt = %s, want %s", got, tc.want)
			}
		})
	}
	// Issued certificates: NotBefore and NotAfter are whole seconds.
	ca := newCA(t)
	c := parse(t, issue(t, ca, NodeIdentity("n1", 1), 7*24*time.Hour).cert)
	if got := Lifetime(c.NotBefore, c.NotAfter); got != 7*24*time.Hour {
		t.Fatalf("an issued certificate's Lifetime = %s", got)
	}
}

func parse(t *testing.T, der []byte) *x509.Certificate {
	t.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRenew(t *testing.T) {
	ca, other := newCA(t), newCA(t)
	later := t0().Add(5 * 24 * time.Hour)
	for _, tc := range []struct {
		name string
		ca   *CA // the CA that issued it
		id   Identity
		ttl  time.Duration // of the certificate renewed
		want error
	}{
		{"site agent", ca, SiteAgentIdentity("s1", "a1"), 90 * 24 * time.Hour, nil},
		{"node", ca, NodeIdentity("n1", 4), 7 * 24 * time.Hour, nil},
		{"node tenant", ca, NodeTenantIdentity("n1", "acme", 4), 7 * 24 * time.Hour, nil},
		{"expired", ca, NodeIdentity("n1", 4), 24 * time.Hour, ErrCertExpired},
		{"another CA's", other, NodeIdentity("n1", 4), 7 * 24 * time.Hour, ErrUnknownCA},
		{"the server's", ca, ServerIdentity(), 90 * 24 * time.Hour, ErrBadIdentity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := issue(t, tc.ca, tc.id, tc.ttl)
			der, err := ca.Renew(old.cert, 30*24*time.Hour, later)
			wantErr(t, err, tc.want)
			if tc.want != nil {
				if der != nil {
					t.Fatal("a refused renewal returned a certificate")
				}
				return
			}
			got, id, err := ca.Verify(der, later)
			if err != nil {
				t.Fatal(err)
			}
			if id != tc.id {
				t.Fatalf("renewed %s, want %s", id, tc.id)
			}
			if !got.PublicKey.(*ecdsa.PublicKey).Equal(old.key.Public()) {
				t.Fatal("the renewed certificate names another key")
			}
			if !got.NotAfter.Equal(later.Add(30*24*time.Hour)) || !got.NotBefore.Equal(later.Add(-ClockSkew)) {
				t.Fatalf("renewed for %s – %s", got.NotBefore, got.NotAfter)
			}
			if _, err := TLSCertificate(der, old.key); err != nil {
				t.Fatalf("the agent's key does not go with the renewed certificate: %v", err)
			}
		})
	}
}

// The server certificate is issued again, with a new key, by the first handshake after two
// thirds of its life; when that fails it serves the current one while it is valid.
func TestServerCertRenews(t *testing.T) {
	ca := newCA(t)
	const ttl = 90 * 24 * time.Hour
	// Issued 100 days before the CA expires: the renewal at day 60 would outlive the CA.
	start := ca.Certificate().NotAfter.Add(-100 * 24 * time.Hour)
	now := start
	sc, err := NewServerCert(ca, []string{"localhost"}, ttl, func() time.Time { return now })
	if err != nil {
		t.Fatal(err)
	}
	first, err := sc.Current()
	if err != nil {
		t.Fatal(err)
	}
	now = start.Add(59 * 24 * time.Hour)
	if c, _ := sc.Current(); c != first {
		t.Fatal("renewed before two thirds of its life")
	}
	now = start.Add(61 * 24 * time.Hour)
	if c, err := sc.Current(); err != nil || c != first {
		t.Fatalf("a renewal that cannot be made: %v, same certificate %v; want the current one", err, c == first)
	}
	now = start.Add(91 * 24 * time.Hour)
	if _, err := sc.Current(); err == nil {
		t.Fatal("an expired certificate that cannot be renewed was served")
	}

	// Far from the CA's end: renewed.
	start = t0()
	now = start
	if sc, err = NewServerCert(ca, []string{"localhost"}, ttl, func() time.Time { return now }); err != nil {
		t.Fatal(err)
	}
	first, _ = sc.Current()
	now = start.Add(61 * 24 * time.Hour)
	second, err := sc.Current()
	if err != nil || second == first {
		t.Fatalf("not renewed after two thirds: %v", err)
	}
	if !second.Leaf.NotAfter.Equal(now.Add(ttl)) || second.Leaf.PublicKey.(*ecdsa.PublicKey).Equal(first.Leaf.PublicKey) {
		t.Fatalf("renewed until %s (want %s), new key %v", second.Leaf.NotAfter, now.Add(ttl), !second.Leaf.PublicKey.(*ecdsa.PublicKey).Equal(first.Leaf.PublicKey))
	}
	if id, err := ParseIdentity(second.Leaf); err != nil || id.Kind != KindServer {
		t.Fatalf("renewed certificate's identity %v %v", id, err)
	}
	if c, _ := sc.Current(); c != second {
		t.Fatal("renewed again at once")
	}
	if _, err := NewServerCert(nil, nil, ttl, nil); err == nil {
		t.Fatal("a server certificate without a CA")
	}
}

// A server serving ServerCert.TLSConfig presents the renewed certificate at the first handshake
// after its renewal time, and clients (trusting the CA, requiring the server identity) accept it.
func TestServerCertHandshakes(t *testing.T) {
	ca, err := CreateCA("tls CA", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Now()
	sc, err := NewServerCert(ca, []string{"127.0.0.1"}, 30*time.Second, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	if err != nil {
		t.Fatal(err)
	}
	presented := func() *big.Int {
		t.Helper()
		addr, res := serveOnce(t, sc.TLSConfig())
		cfg := ClientTLSConfig(ca.CertPEM(), tls.Certificate{})
		cfg.ServerName = "127.0.0.1"
		var serial *big.Int
		cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			c, err := x509.ParseCertificate(raw[0])
			if err == nil {
				serial = c.SerialNumber
			}
			return err
		}
		if err := dial(addr, cfg); err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if r := <-res; r.err != nil {
			t.Fatalf("server side: %v", r.err)
		}
		return serial
	}
	first := presented()
	if again := presented(); again.Cmp(first) != 0 {
		t.Fatal("renewed before its time")
	}
	mu.Lock()
	now = now.Add(25 * time.Second) // past two thirds of 30 s
	mu.Unlock()
	if renewed := presented(); renewed.Cmp(first) == 0 {
		t.Fatal("the handshake after the renewal time got the first certificate")
	}
}
