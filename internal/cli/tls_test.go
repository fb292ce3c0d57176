package cli

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bcd/internal/server"
)

// apiPKI is a private CA and a server certificate it signed, as files.
type apiPKI struct {
	caFile, certFile, keyFile string
}

// newAPIPKI makes a CA and a certificate for the API at 127.0.0.1 (or for the names given).
func newAPIPKI(t *testing.T, names ...string) apiPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "private CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "bcd api"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if len(names) == 0 {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	tmpl.DNSNames = names
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := apiPKI{caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "api.crt"), keyFile: filepath.Join(dir, "api.key")}
	for path, b := range map[string][]byte{
		p.caFile:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		p.certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		p.keyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// newTLSServer runs a server whose API is served over TLS with p's certificate.
func newTLSServer(t *testing.T, p apiPKI) *server.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := server.New(ctx, server.Config{Listen: "127.0.0.1:0", GatewayListen: "127.0.0.1:0", DataDir: t.TempDir(), APITLSCert: p.certFile, APITLSKey: p.keyFile},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server: %v", err)
		}
	})
	return srv
}

// TestCLIOverTLS: client commands reach an https:// server whose certificate a private CA
// signed when given the CA (--ca-file or $BCD_CA_FILE), and are refused with what to do
// without it.
func TestCLIOverTLS(t *testing.T) {
	p := newAPIPKI(t)
	srv := newTLSServer(t, p)
	url, token := srv.URL(), srv.FirstAdminToken()
	if !strings.HasPrefix(url, "https://") {
		t.Fatalf("server URL %s", url)
	}
	plain := newServer(t)
	key, err := os.ReadFile(p.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want int
		msg  string // in stderr
	}{
		{"--ca-file", map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}, []string{"token", "whoami", "--ca-file", p.caFile}, 0, ""},
		{"BCD_CA_FILE", map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_CA_FILE": p.caFile}, []string{"pool", "list"}, 0, ""},
		{"image list", map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_CA_FILE": p.caFile}, []string{"image", "list"}, 0, ""},
		{"node list", map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_CA_FILE": p.caFile}, []string{"node", "list", "-o", "json"}, 0, ""},
		{"no CA: the system's do not trust it", map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}, []string{"token", "whoami"}, 5,
			"error: the server's TLS certificate is not trusted: x509: certificate signed by unknown authority (give the CA that signed it with --ca-file FILE or env BCD_CA_FILE)"},
		{"another CA", map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_CA_FILE": newAPIPKI(t).caFile}, []string{"token", "whoami"}, 5, "not trusted"},
		{"a CA file that is not there", map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token}, []string{"token", "whoami", "--ca-file", p.caFile + ".missing"}, 1,
			"--ca-file: reading the CA certificates: open " + p.caFile + ".missing: no such file or directory"},
		{"the key as CA file", map[string]string{"BCD_SERVER": url, "BCD_TOKEN": token, "BCD_CA_FILE": p.keyFile}, []string{"token", "whoami"}, 2,
			"BCD_CA_FILE " + p.keyFile + " holds a PRIVATE KEY block"},
		{"https:// to a plain HTTP server", map[string]string{"BCD_SERVER": strings.Replace(plain.URL(), "http://", "https://", 1), "BCD_TOKEN": token}, []string{"token", "whoami"}, 2,
			"error: the server does not speak TLS at --server (https://…): use http://…"},
		{"http:// to a TLS server", map[string]string{"BCD_SERVER": strings.Replace(url, "https://", "http://", 1), "BCD_TOKEN": token}, []string{"token", "whoami"}, 2,
			"error: the server speaks TLS at --server (http://…): use https://…"},
		{"BCD_CA_FILE is ignored for an http:// server", map[string]string{"BCD_SERVER": plain.URL(), "BCD_TOKEN": plain.FirstAdminToken(), "BCD_CA_FILE": p.keyFile}, []string{"token", "whoami"}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errs := run(t, tc.env, tc.args...)
			if code != tc.want || !strings.Contains(errs, tc.msg) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errs, tc.want, tc.msg)
			}
			if strings.Contains(errs, string(key[40:80])) {
				t.Errorf("stderr shows the key: %q", errs)
			}
		})
	}
}

// A certificate for another name is refused saying so.
func TestCLIOverTLSWrongName(t *testing.T) {
	p := newAPIPKI(t, "api.example")
	srv := newTLSServer(t, p)
	code, _, errs := run(t, map[string]string{"BCD_SERVER": srv.URL(), "BCD_TOKEN": srv.FirstAdminToken(), "BCD_CA_FILE": p.caFile}, "token", "whoami")
	if code != 5 || !strings.Contains(errs, "the server's TLS certificate does not name the host of --server") || !strings.Contains(errs, "127.0.0.1") {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
}

// bcd sim --server drives an https:// server with --ca-file: its API calls and its reading of
// the server's /metrics trust the CA.
func TestSimAgainstATLSServer(t *testing.T) {
	p := newAPIPKI(t)
	srv := newTLSServer(t, p)
	code, out, errs := run(t, map[string]string{}, "sim", "--server", srv.URL(), "--token", srv.FirstAdminToken(), "--ca-file", p.caFile, "--nodes", "2", "--json", "--timeout", "2m")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var rep struct {
		Phases []struct{ Nodes, Failed int }
		RSSOf  string `json:"rssOf"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Phases) != 3 || rep.RSSOf != "server, sampled" {
		t.Fatalf("report %q: %v", out, err)
	}
	for _, ph := range rep.Phases {
		if ph.Nodes != 2 || ph.Failed != 0 {
			t.Errorf("phase %+v", ph)
		}
	}
}

// bcd bench api --external measures an https:// server with --ca-file.
func TestBenchExternalOverTLS(t *testing.T) {
	p := newAPIPKI(t)
	srv := newTLSServer(t, p)
	code, out, errs := run(t, map[string]string{"BCD_SERVER": srv.URL(), "BCD_TOKEN": srv.FirstAdminToken(), "BCD_CA_FILE": p.caFile},
		"bench", "api", "--external", "--nodes", "20", "--clients", "2", "--json")
	if code != 0 || !strings.Contains(out, `"nodes":20`) {
		t.Fatalf("exit %d: %s %s", code, out, errs)
	}
	code, _, errs = run(t, map[string]string{"BCD_SERVER": srv.URL(), "BCD_TOKEN": srv.FirstAdminToken()}, "bench", "api", "--external", "--nodes", "1")
	if code != 5 || !strings.Contains(errs, "x509: certificate signed by unknown authority") {
		t.Fatalf("without the CA: exit %d: %s", code, errs)
	}
}

func TestLoadCAs(t *testing.T) {
	dir := t.TempDir()
	p := newAPIPKI(t)
	ca, _ := os.ReadFile(p.caFile)
	cert, _ := os.ReadFile(p.certFile)
	key, _ := os.ReadFile(p.keyFile)
	file := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, tc := range []struct {
		name  string
		path  string
		usage bool
		want  string // "" accepted
	}{
		{"one CA", p.caFile, false, ""},
		{"a bundle", file("bundle.pem", append(append([]byte{}, ca...), cert...)), false, ""},
		{"missing", filepath.Join(dir, "missing.pem"), false, "--ca-file: reading the CA certificates"},
		{"empty", file("empty.pem", nil), true, "holds no PEM certificate"},
		{"not PEM", file("der.crt", []byte("\x30\x82garbage")), true, "holds no PEM certificate"},
		{"a key", file("key.pem", key), true, "holds a PRIVATE KEY block"},
		{"a broken certificate", file("broken.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("nope")})), true, "certificate 1:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, err := loadCAs(tc.path, "--ca-file")
			switch {
			case tc.want == "" && (err != nil || pool == nil):
				t.Fatalf("refused: %v", err)
			case tc.want == "":
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("got %v, want %q", err, tc.want)
			case (exitCode(err) == exitUsage) != tc.usage:
				t.Errorf("exit code %d", exitCode(err))
			}
			if err != nil && strings.Contains(err.Error(), string(key[40:80])) {
				t.Errorf("error shows the key: %v", err)
			}
		})
	}
}
