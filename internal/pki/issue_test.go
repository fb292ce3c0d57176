package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestIssueAndVerifyEveryKind(t *testing.T) {
	ca := newCA(t)
	const ttl = 24 * time.Hour
	for _, id := range allKindsIdentities() {
		t.Run(id.Kind.String(), func(t *testing.T) {
			got := issue(t, ca, id, ttl)
			cert, gotID, err := ca.Verify(got.cert, t0().Add(time.Hour))
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			if gotID != id {
				t.Fatalf("identity = %+v, want %+v", gotID, id)
			}
			if parsed, err := ParseIdentity(cert); err != nil || parsed != id {
				t.Fatalf("ParseIdentity = %+v, %v", parsed, err)
			}
			if cert.IsCA {
				t.Fatal("leaf is a CA")
			}
			if !cert.NotAfter.Equal(t0().Add(ttl)) || !cert.NotBefore.Equal(t0().Add(-ClockSkew)) {
				t.Fatalf("validity %s..%s", cert.NotBefore, cert.NotAfter)
			}
			wantEKU := x509.ExtKeyUsageClientAuth
			if id.Kind == KindServer {
				wantEKU = x509.ExtKeyUsageServerAuth
			}
			if !slices.Equal(cert.ExtKeyUsage, []x509.ExtKeyUsage{wantEKU}) {
				t.Fatalf("ExtKeyUsage = %v, want [%v]", cert.ExtKeyUsage, wantEKU)
			}
			wantKA := id.Kind == KindSiteAgent || id.Kind == KindNode
			if gotKA := cert.KeyUsage&x509.KeyUsageKeyAgreement != 0; gotKA != wantKA {
				t.Fatalf("key agreement = %v, want %v", gotKA, wantKA)
			}
			if cert.KeyUsage&x509.KeyUsageDigitalSignature == 0 {
				t.Fatal("no digital signature key usage")
			}
			if !cert.PublicKey.(*ecdsa.PublicKey).Equal(got.key.Public()) {
				t.Fatal("certificate key is not the CSR's key")
			}
			if len(cert.Subject.CommonName) > 64 || cert.Subject.CommonName == "" {
				t.Fatalf("common name %q", cert.Subject.CommonName)
			}
		})
	}
}

func TestIssueServerHosts(t *testing.T) {
	ca := newCA(t)
	certPEM, keyPEM, err := ca.IssueServer([]string{"LocalHost", "127.0.0.1", "::1", "bcd.example.com"}, time.Hour, t0())
	if err != nil {
		t.Fatal(err)
	}
	der, err := DecodeCertPEM(certPEM)
	if err != nil {
		t.Fatal(err)
	}
	cert, id, err := ca.Verify(der, t0())
	if err != nil || id != ServerIdentity() {
		t.Fatalf("Verify = %+v, %v", id, err)
	}
	if !slices.Equal(cert.DNSNames, []string{"localhost", "bcd.example.com"}) {
		t.Fatalf("DNSNames = %v", cert.DNSNames)
	}
	if len(cert.IPAddresses) != 2 || cert.IPAddresses[0].String() != "127.0.0.1" || cert.IPAddresses[1].String() != "::1" {
		t.Fatalf("IPAddresses = %v", cert.IPAddresses)
	}
	key, err := ParseKeyPEM(keyPEM)
	if err != nil || !cert.PublicKey.(*ecdsa.PublicKey).Equal(key.Public()) {
		t.Fatalf("server key does not match: %v", err)
	}
	for _, host := range []string{"localhost", "127.0.0.1", "::1"} {
		if err := cert.VerifyHostname(host); err != nil {
			t.Errorf("VerifyHostname(%s): %v", host, err)
		}
	}
}

func TestIssueServerRefusesHosts(t *testing.T) {
	ca := newCA(t)
	many := make([]string, 101)
	for i := range many {
		many[i] = fmt.Sprintf("h%d", i)
	}
	tests := map[string][]string{
		"none":           nil,
		"empty":          {""},
		"wildcard":       {"*.example.com"},
		"underscore":     {"a_b.example.com"},
		"empty label":    {"a..b"},
		"leading dash":   {"-a.example.com"},
		"trailing dash":  {"a-.example.com"},
		"long label":     {strings.Repeat("a", 64) + ".com"},
		"long name":      {strings.Repeat("abcdefg.", 32) + "com"},
		"space":          {"a b"},
		"url":            {"https://x"},
		"too many hosts": many,
	}
	for name, hosts := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := ca.IssueServer(hosts, time.Hour, t0())
			wantErr(t, err, ErrBadInput)
		})
	}
}

func TestIssueIgnoresCSRContents(t *testing.T) {
	ca := newCA(t)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	evil, _ := url.Parse("bcd://server")
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: "bcd server"},
		URIs:     []*url.URL{evil},
		DNSNames: []string{"bcd.example.com"},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	der, err := ca.IssueNode(csr, "n1", 3, time.Hour, t0())
	if err != nil {
		t.Fatal(err)
	}
	cert, id, err := ca.Verify(der, t0())
	if err != nil {
		t.Fatal(err)
	}
	if id != NodeIdentity("n1", 3) || len(cert.URIs) != 1 || len(cert.DNSNames) != 0 || cert.Subject.CommonName != "node n1" {
		t.Fatalf("CSR contents leaked into the certificate: id %+v URIs %v DNS %v CN %q", id, cert.URIs, cert.DNSNames, cert.Subject.CommonName)
	}
}

func TestIssueRefusesBadCSR(t *testing.T) {
	ca := newCA(t)
	_, good, err := NewKeyAndCSR("agent-aaaa")
	if err != nil {
		t.Fatal(err)
	}
	// Same request with its signed subject altered: parses, signature does not verify.
	tampered := bytes.Replace(good, []byte("agent-aaaa"), []byte("agent-bbbb"), 1)
	if bytes.Equal(tampered, good) {
		t.Fatal("tampering did not change the CSR")
	}
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	edCSR, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, edKey)
	if err != nil {
		t.Fatal(err)
	}
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	p384CSR, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, p384)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string][]byte{
		"nil":           nil,
		"garbage":       []byte("not a csr"),
		"truncated":     good[:len(good)/2],
		"bad signature": tampered,
		"ed25519 key":   edCSR,
		"P-384 key":     p384CSR,
	}
	for name, csr := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ca.IssueSiteAgent(csr, "s", "a", time.Hour, t0())
			wantErr(t, err, ErrBadCSR)
			_, err = ca.IssueNode(csr, "n", 1, time.Hour, t0())
			wantErr(t, err, ErrBadCSR)
			_, err = ca.IssueNodeTenant(csr, "n", "t", 1, time.Hour, t0())
			wantErr(t, err, ErrBadCSR)
		})
	}
	if _, err := ca.IssueNode(good, "n", 1, time.Hour, t0()); err != nil {
		t.Fatalf("the untampered CSR is refused: %v", err)
	}
}

func TestIssueRefusesBadInputs(t *testing.T) {
	ca := newCA(t)
	_, csr, err := NewKeyAndCSR("x")
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", MaxIDLength+1)
	tests := []struct {
		name  string
		issue func() ([]byte, error)
		want  error
	}{
		{"empty site", func() ([]byte, error) { return ca.IssueSiteAgent(csr, "", "a", time.Hour, t0()) }, ErrBadIdentity},
		{"empty agent", func() ([]byte, error) { return ca.IssueSiteAgent(csr, "s", "", time.Hour, t0()) }, ErrBadIdentity},
		{"slash in agent", func() ([]byte, error) { return ca.IssueSiteAgent(csr, "s", "a/b", time.Hour, t0()) }, ErrBadIdentity},
		{"long node", func() ([]byte, error) { return ca.IssueNode(csr, long, 1, time.Hour, t0()) }, ErrBadIdentity},
		{"query in node", func() ([]byte, error) { return ca.IssueNode(csr, "n?x=1", 1, time.Hour, t0()) }, ErrBadIdentity},
		{"empty tenant", func() ([]byte, error) { return ca.IssueNodeTenant(csr, "n", "", 1, time.Hour, t0()) }, ErrBadIdentity},
		{"zero ttl", func() ([]byte, error) { return ca.IssueNode(csr, "n", 1, 0, t0()) }, ErrBadInput},
		{"negative ttl", func() ([]byte, error) { return ca.IssueNode(csr, "n", 1, -time.Hour, t0()) }, ErrBadInput},
		{"ttl too long", func() ([]byte, error) { return ca.IssueNode(csr, "n", 1, MaxLeafTTL+time.Second, t0()) }, ErrBadInput},
		{"outlives CA", func() ([]byte, error) {
			return ca.IssueNode(csr, "n", 1, 365*24*time.Hour, t0().Add(CAValidity-24*time.Hour))
		}, ErrBadInput},
		{"before CA", func() ([]byte, error) { return ca.IssueNode(csr, "n", 1, time.Hour, t0().Add(-time.Hour)) }, ErrBadInput},
		{"server zero ttl", func() ([]byte, error) {
			c, _, err := ca.IssueServer([]string{"localhost"}, 0, t0())
			return c, err
		}, ErrBadInput},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			der, err := tt.issue()
			wantErr(t, err, tt.want)
			if der != nil {
				t.Fatal("certificate returned with an error")
			}
		})
	}
}

func TestNewKeyAndCSR(t *testing.T) {
	key, csrDER, err := NewKeyAndCSR("site nyc-1")
	if err != nil {
		t.Fatal(err)
	}
	pub, err := checkCSR(csrDER)
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Equal(key.Public()) {
		t.Fatal("CSR key differs from the returned key")
	}
	back, err := DecodeCSRPEM(EncodeCSRPEM(csrDER))
	if err != nil || !bytes.Equal(back, csrDER) {
		t.Fatalf("CSR PEM round trip: %v", err)
	}
	if _, _, err := NewKeyAndCSR(strings.Repeat("c", 65)); err == nil {
		t.Fatal("65-byte common name accepted")
	}
}

func TestPEMHelpers(t *testing.T) {
	if _, err := DecodeCertPEM([]byte("nothing")); err == nil {
		t.Fatal("DecodeCertPEM accepted no PEM")
	}
	// The wanted block is found after blocks of other types.
	mixed := append(EncodeCSRPEM([]byte{1, 2}), EncodeCertPEM([]byte{3, 4})...)
	if der, err := DecodeCertPEM(mixed); err != nil || !bytes.Equal(der, []byte{3, 4}) {
		t.Fatalf("DecodeCertPEM(mixed) = %v, %v", der, err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pkcs8, err := EncodeKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	sec1DER, _ := x509.MarshalECPrivateKey(key)
	sec1 := pemBlock("EC PRIVATE KEY", sec1DER)
	for name, data := range map[string][]byte{"pkcs8": pkcs8, "sec1": sec1} {
		got, err := ParseKeyPEM(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !got.(*ecdsa.PrivateKey).Equal(key) {
			t.Fatalf("%s: different key", name)
		}
	}
	for name, data := range map[string][]byte{
		"none":          []byte("x"),
		"corrupt pkcs8": pemBlock("PRIVATE KEY", []byte("junk")),
		"corrupt sec1":  pemBlock("EC PRIVATE KEY", []byte("junk")),
	} {
		if _, err := ParseKeyPEM(data); err == nil {
			t.Fatalf("%s: accepted", name)
		}
	}
}
