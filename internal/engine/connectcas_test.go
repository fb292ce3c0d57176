package engine

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestConnectedRecordsCAsInOneWrite: an agent's connection is one write, which records with its
// row what it says of its CAs (its hello's fingerprints) and the CA that issued its certificate,
// as bcd ca activate and finish read them. A hello naming more than the bounds allow connects
// all the same, recorded as never having said (a rotation waits for it).
func TestConnectedRecordsCAsInOneWrite(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		now := time.Now()
		ca, err := pki.CreateCA("test CA", now)
		if err != nil {
			t.Fatal(err)
		}
		next, err := pki.CreateCA("next CA", now)
		if err != nil {
			t.Fatal(err)
		}
		e := New(st, ca, nil, Config{})
		g := e.Gateway()
		connect := func(id, connID string, a gateway.AgentRef, issue func(csr []byte) ([]byte, error), hello gateway.Hello) *x509.Certificate {
			t.Helper()
			_, csr, err := pki.NewKeyAndCSR(id)
			if err != nil {
				t.Fatal(err)
			}
			der, err := issue(csr)
			if err != nil {
				t.Fatal(err)
			}
			cert, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			// The same connection made again (a reconnect records the same) is measured up to
			// three times: a write of the store's own (a heartbeat) may land in one window on a
			// loaded machine, not in three; two writes per connection would show in every one.
			var counts []int64
			for range 3 {
				if st.Engine() == store.SQLite {
					// SQLite's writer counts a group's writes once it answered them: a write made
					// now runs after every earlier group was counted.
					if err := st.Write(ctx, func(*store.Tx) error { return nil }); err != nil {
						t.Fatal(err)
					}
				}
				before := st.WriterStats().Writes
				if err := g.Connected(context.WithValue(ctx, connKey{}, conn{id: connID, cert: der}), a, hello); err != nil {
					t.Fatalf("%s connecting: %v", id, err)
				}
				if st.Engine() != store.SQLite {
					break
				}
				var n int64
				if err := st.Write(ctx, func(*store.Tx) error { n = st.WriterStats().Writes - before; return nil }); err != nil {
					t.Fatal(err)
				}
				counts = append(counts, n)
				if n == 1 {
					break
				}
			}
			if st.Engine() == store.SQLite && !slices.Contains(counts, 1) {
				t.Errorf("%s's connection took %v writes in three tries; want 1", id, counts)
			}
			return cert
		}
		both := []string{ca.Fingerprint(), next.Fingerprint()}
		site := connect("a1", "c1", gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: "s1", AgentID: "a1"}, func(csr []byte) ([]byte, error) {
			return ca.IssueSiteAgent(csr, "s1", "a1", time.Hour, now)
		}, gateway.Hello{AgentVersion: "v1", CAs: both})
		ramdisk := connect("n1", "c2", gateway.AgentRef{Kind: pki.KindNode, NodeID: "n1", Generation: 1}, func(csr []byte) ([]byte, error) {
			return ca.IssueNode(csr, "n1", 1, 2*time.Hour, now)
		}, gateway.Hello{CAs: both[:1]})
		many := slices.Repeat([]string{strings.Repeat("ab", 32)}, store.MaxAgentCAs+1)
		connect("a2", "c3", gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: "s1", AgentID: "a2"}, func(csr []byte) ([]byte, error) {
			return ca.IssueSiteAgent(csr, "s1", "a2", time.Hour, now)
		}, gateway.Hello{CAs: many})

		got, err := st.ConnectedAgentsCATrust(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 3 {
			t.Fatalf("connected agents %+v; want a1, a2 and node:n1", got)
		}
		for _, c := range []struct {
			a       store.AgentCATrust
			id      string
			trusted []string
			cert    *x509.Certificate
		}{{got[0], "a1", both, site}, {got[2], "node:n1", both[:1], ramdisk}} {
			if c.a.AgentID != c.id || !c.a.Reported || !slices.Equal(c.a.Trusted, c.trusted) || c.a.CertIssuer != ca.Fingerprint() ||
				c.a.CertNotAfter != c.cert.NotAfter.UnixMicro() {
				t.Errorf("%s recorded %+v; want it trusting %v, its certificate issued by %s, ending %d", c.id, c.a, c.trusted, ca.Fingerprint(), c.cert.NotAfter.UnixMicro())
			}
		}
		if a := got[1]; a.AgentID != "a2" || a.Reported || len(a.Trusted) != 0 {
			t.Errorf("a2, out of bounds, recorded %+v; want connected, unreported", a)
		}
	})
}

// The CA that issued an agent's certificate is read from the chain the TLS handshake verified
// (Wrap), not checked a second time; a connection whose handshake verified no chain has the
// certificate's issuer looked up among the CAs (CA.IssuerOf), and one without a certificate
// has none.
func TestConnectionIssuerComesFromTheHandshake(t *testing.T) {
	now := time.Now()
	ca, err := pki.CreateCA("test CA", now)
	if err != nil {
		t.Fatal(err)
	}
	_, csr, err := pki.NewKeyAndCSR("n1")
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.IssueNode(csr, "n1", 1, time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	root := pki.BundleCerts(ca.CertPEM())[0]
	g := New(nil, ca, nil, Config{}).Gateway()
	for _, tc := range []struct {
		name       string
		state      *tls.ConnectionState
		wantIssuer string // conn.issuer, as Wrap records it
	}{
		{"verified chain", &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}, VerifiedChains: [][]*x509.Certificate{{leaf, root}}}, ca.Fingerprint()},
		{"certificate, no verified chain", &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}, ""},
		{"no certificate", &tls.ConnectionState{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c conn
			g.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				c, _ = r.Context().Value(connKey{}).(conn)
			})).ServeHTTP(httptest.NewRecorder(), (&http.Request{TLS: tc.state}).WithContext(context.Background()))
			if c.id == "" || c.issuer != tc.wantIssuer {
				t.Fatalf("Wrap gave the connection id %q, issuer %q; want an id, issuer %q", c.id, c.issuer, tc.wantIssuer)
			}
			// Whichever way it was found, the recorded issuer is the CA's.
			want := ca.Fingerprint()
			if len(tc.state.PeerCertificates) == 0 {
				want = ""
			}
			cas := g.saidCAs(context.Background(), Agent{ID: "node:n1"}, c, gateway.Hello{})
			if cas == nil || cas.Issuer != want {
				t.Errorf("recorded CAs %+v; want issuer %q", cas, want)
			}
		})
	}
	// What the handshake verified is taken as it is: no signature is checked again (here a
	// fingerprint the certificate's own signature would not give).
	next, err := pki.CreateCA("next CA", now)
	if err != nil {
		t.Fatal(err)
	}
	if cas := g.saidCAs(context.Background(), Agent{ID: "node:n1"}, conn{id: "c", cert: der, issuer: next.Fingerprint()}, gateway.Hello{}); cas == nil || cas.Issuer != next.Fingerprint() {
		t.Errorf("recorded CAs %+v for a connection the handshake said %s issued; want that issuer", cas, next.Fingerprint())
	}
}
