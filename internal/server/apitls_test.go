package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bcd/internal/testlog"
)

// testCA issues certificates for tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test API CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue is a server certificate for 127.0.0.1 with serial, and its key (PEM).
func (ca *testCA) issue(t *testing.T, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "bcd api"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// replace writes b to path as a renewal does: a new file renamed over the old one.
func replace(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// logBuffer is a log sink safe for concurrent writers that the test reads.
type logBuffer = testlog.Buffer

// TestAPITLSRefusedAtStart: a pair the server cannot serve is refused at start, naming the flag
// and what was wrong, before the store is opened; no error holds the key.
func TestAPITLSRefusedAtStart(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	certA, keyA := ca.issue(t, 2)
	_, keyB := ca.issue(t, 3)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key, otherKey := write("cert.pem", certA), write("key.pem", keyA), write("other.key", keyB)
	garbage := write("garbage.pem", []byte("not PEM\n"))
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		name, cert, key string
		want            []string
	}{
		{"certificate alone", cert, "", []string{"--api-tls-cert given without --api-tls-key", "give both"}},
		{"key alone", "", key, []string{"--api-tls-key given without --api-tls-cert"}},
		{"missing certificate file", missing, key, []string{"--api-tls-cert " + missing, "no such file"}},
		{"missing key file", cert, missing, []string{"--api-tls-key " + missing, "no such file"}},
		{"certificate not PEM", garbage, key, []string{"--api-tls-cert " + garbage + " and --api-tls-key", "failed to find any PEM data in certificate input"}},
		{"key not PEM", cert, garbage, []string{"--api-tls-key " + garbage, "failed to find any PEM data in key input"}},
		{"key of another certificate", cert, otherKey, []string{"--api-tls-key " + otherKey, "private key does not match public key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			_, err := New(context.Background(), Config{Listen: "127.0.0.1:0", GatewayListen: "off", DataDir: data, APITLSCert: tc.cert, APITLSKey: tc.key},
				slog.New(slog.DiscardHandler))
			if err == nil {
				t.Fatal("the server started")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), string(keyA[40:80])) {
				t.Errorf("error holds the key: %q", err)
			}
			if _, err := os.Stat(filepath.Join(data, "bcd.db")); err == nil {
				t.Error("the store was opened before the pair was checked")
			}
		})
	}
}

// TestAPIOverTLSReloadsRenewedCertificate: the API serves its certificate over TLS 1.2+ with
// HTTP/2, picks up a renewed pair without a restart, keeps the last good one (and logs) when a
// changed pair is bad, and takes the pair once it is repaired.
func TestAPIOverTLSReloadsRenewedCertificate(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key")
	c2, k2 := ca.issue(t, 2)
	replace(t, certFile, c2)
	replace(t, keyFile, k2)
	logs := &logBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := New(ctx, Config{Listen: "127.0.0.1:0", GatewayListen: "off", DataDir: t.TempDir(), APITLSCert: certFile, APITLSKey: keyFile},
		slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	if !strings.HasPrefix(srv.URL(), "https://") {
		t.Fatalf("URL %s, want https://", srv.URL())
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	// serial is the serial of the certificate a new connection gets.
	serial := func() int64 {
		t.Helper()
		conn, err := tls.Dial("tcp", srv.Addr(), &tls.Config{RootCAs: pool, NextProtos: []string{"h2", "http/1.1"}})
		if err != nil {
			t.Fatalf("TLS handshake: %v", err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
	}
	waitSerial := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for got := serial(); got != want; got = serial() {
			if time.Now().After(deadline) {
				t.Fatalf("new connections get serial %d, want %d", got, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if got := serial(); got != 2 {
		t.Fatalf("serial %d, want 2", got)
	}

	// HTTP/2 over TLS, and nothing below TLS 1.2.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(srv.URL() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || string(body) != "ok\n" {
		t.Fatalf("/healthz: %s %q, want HTTP/2 ok", resp.Proto, body)
	}
	if conn, err := tls.Dial("tcp", srv.Addr(), &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS11}); err == nil {
		conn.Close()
		t.Fatal("a TLS 1.1 handshake succeeded")
	}

	// Renewed: the next connections get the new certificate.
	c3, k3 := ca.issue(t, 3)
	replace(t, certFile, c3)
	replace(t, keyFile, k3)
	waitSerial(3)
	if !strings.Contains(logs.String(), "loaded the API's renewed TLS certificate") {
		t.Errorf("the reload is not logged:\n%s", logs)
	}

	// A changed pair that does not match: handshakes go on with serial 3, and it is logged.
	c4, _ := ca.issue(t, 4)
	replace(t, certFile, c4)
	for range 3 {
		if got := serial(); got != 3 {
			t.Fatalf("after a bad renewal: serial %d, want the last good 3", got)
		}
	}
	if n := strings.Count(logs.String(), "do not load"); n != 1 {
		t.Errorf("the bad pair is logged %d times, want once:\n%s", n, logs)
	}
	if strings.Contains(logs.String(), "PRIVATE KEY") {
		t.Errorf("the log holds a key:\n%s", logs)
	}

	// Repaired (the key of the new certificate arrives): taken.
	c5, k5 := ca.issue(t, 5)
	replace(t, keyFile, k5)
	replace(t, certFile, c5)
	waitSerial(5)
}

// fakeListener is a listener at an address, for decisions about it.
type fakeListener struct {
	net.Listener
	addr net.Addr
}

func (l fakeListener) Addr() net.Addr { return l.addr }

// TestPlainHTTPWarning: the warning that the API crosses the network in clear is for plain HTTP
// on an address other hosts reach, not for TLS.
func TestPlainHTTPWarning(t *testing.T) {
	public := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 7480}
	loopback := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7480}
	for _, tc := range []struct {
		name string
		addr net.Addr
		tls  bool
		want bool
	}{
		{"plain HTTP, reachable", public, false, true},
		{"plain HTTP, loopback", loopback, false, false},
		{"TLS, reachable", public, true, false},
		{"TLS, loopback", loopback, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{ln: fakeListener{addr: tc.addr}}
			if tc.tls {
				s.apiCert = &apiCert{}
			}
			if got := s.warnInClear(); got != tc.want {
				t.Errorf("warnInClear() = %v, want %v", got, tc.want)
			}
		})
	}
}
