package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func TestCreateCA(t *testing.T) {
	ca := newCA(t)
	c := ca.Certificate()
	if !c.IsCA || c.MaxPathLen != 0 || !c.MaxPathLenZero || c.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Fatalf("CA constraints: IsCA %v MaxPathLen %d zero %v usage %v", c.IsCA, c.MaxPathLen, c.MaxPathLenZero, c.KeyUsage)
	}
	if !c.NotAfter.Equal(t0().Add(CAValidity)) {
		t.Fatalf("NotAfter %s", c.NotAfter)
	}
	if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Fatalf("CA key is %T", c.PublicKey)
	}
	if c.SerialNumber.BitLen() != 127 {
		t.Fatalf("serial has %d bits", c.SerialNumber.BitLen())
	}
	// Pool returns a copy each time.
	p := ca.Pool()
	p.AddCert(newCA(t).Certificate())
	if ca.Pool().Equal(p) {
		t.Fatal("Pool shares state between calls")
	}
	for _, cn := range []string{"", strings.Repeat("c", 65)} {
		if _, err := CreateCA(cn, t0()); err == nil {
			t.Fatalf("CreateCA(%q) accepted", cn)
		}
	}
}

func TestLoadCARoundTrip(t *testing.T) {
	ca := newCA(t)
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := LoadCA(ca.CertPEM(), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.Fingerprint() != ca.Fingerprint() {
		t.Fatal("loaded CA differs")
	}
	// A certificate issued by one verifies with the other, both ways.
	a := issue(t, ca, NodeIdentity("n", 1), time.Hour)
	b := issue(t, loaded, NodeIdentity("n", 1), time.Hour)
	for _, pair := range []struct {
		ca   *CA
		cert []byte
	}{{loaded, a.cert}, {ca, b.cert}} {
		if _, _, err := pair.ca.Verify(pair.cert, t0()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLoadCARefuses(t *testing.T) {
	ca := newCA(t)
	keyPEM, _ := ca.KeyPEM()
	other := newCA(t)
	otherKey, _ := other.KeyPEM()
	serverCert, serverKey, err := ca.IssueServer([]string{"localhost"}, time.Hour, t0())
	if err != nil {
		t.Fatal(err)
	}
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	p384PEM, _ := EncodeKeyPEM(p384)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	edPEM, _ := EncodeKeyPEM(edKey)
	tests := []struct {
		name         string
		certPEM, key []byte
		want         error
	}{
		{"no cert", nil, keyPEM, ErrBadInput},
		{"garbage cert", pemBlock("CERTIFICATE", []byte("junk")), keyPEM, ErrCertInvalid},
		{"leaf cert", serverCert, serverKey, ErrCertInvalid},
		{"no key", ca.CertPEM(), nil, ErrBadInput},
		{"other CA's key", ca.CertPEM(), otherKey, ErrBadInput},
		{"P-384 key", ca.CertPEM(), p384PEM, ErrBadInput},
		{"ed25519 key", ca.CertPEM(), edPEM, ErrBadInput},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := LoadCA(tt.certPEM, tt.key)
			wantErr(t, err, tt.want)
			if got != nil {
				t.Fatal("CA returned with an error")
			}
			assertNoKeyMaterial(t, err.Error(), keyPEM, otherKey, serverKey, p384PEM, edPEM)
		})
	}
}

func TestLoadCADir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ca")
	if _, found, err := LoadCADir(dir); err != nil || found {
		t.Fatalf("no directory: found %v, %v", found, err)
	}
	ca, err := CreateCA("test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, _ := ca.KeyPEM()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, CAKeyFile), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, CACertFile), ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	again, found, err := LoadCADir(dir)
	if err != nil || !found {
		t.Fatalf("found %v, %v", found, err)
	}
	if again.Fingerprint() != ca.Fingerprint() {
		t.Fatal("loaded a different CA")
	}
	keyB, _ := again.KeyPEM()
	if !bytes.Equal(keyPEM, keyB) {
		t.Fatal("loaded a different key")
	}

	t.Run("key readable by others", func(t *testing.T) {
		if err := os.Chmod(filepath.Join(dir, CAKeyFile), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := LoadCADir(dir)
		wantErr(t, err, ErrBadInput)
		if err := os.Chmod(filepath.Join(dir, CAKeyFile), 0o600); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("certificate missing", func(t *testing.T) {
		if err := os.Remove(filepath.Join(dir, CACertFile)); err != nil {
			t.Fatal(err)
		}
		_, _, err := LoadCADir(dir)
		wantErr(t, err, ErrBadInput)
		if _, err := os.Stat(filepath.Join(dir, CAKeyFile)); err != nil {
			t.Fatalf("the lone key was touched: %v", err)
		}
	})
	t.Run("key missing", func(t *testing.T) {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, CACertFile), ca.CertPEM(), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := LoadCADir(d)
		wantErr(t, err, ErrBadInput)
	})
	t.Run("corrupt key", func(t *testing.T) {
		d := t.TempDir()
		os.WriteFile(filepath.Join(d, CACertFile), ca.CertPEM(), 0o644)
		os.WriteFile(filepath.Join(d, CAKeyFile), []byte("junk"), 0o600)
		_, _, err := LoadCADir(d)
		wantErr(t, err, ErrBadInput)
	})
}

func TestVerifyRefuses(t *testing.T) {
	ca := newCA(t)
	// Same subject, different key: names match, signature does not.
	twin := newCA(t)
	if !bytes.Equal(twin.Certificate().RawSubject, ca.Certificate().RawSubject) {
		t.Fatal("twin CA should share the subject")
	}
	other, err := CreateCA("other CA", t0())
	if err != nil {
		t.Fatal(err)
	}
	const ttl = time.Hour
	good := issue(t, ca, NodeIdentity("n", 1), ttl)
	tests := []struct {
		name string
		cert []byte
		at   time.Time
		want error
	}{
		{"valid", good.cert, t0(), nil},
		{"valid at NotBefore", good.cert, t0().Add(-ClockSkew), nil},
		{"valid at NotAfter", good.cert, t0().Add(ttl), nil},
		{"expired", good.cert, t0().Add(ttl + time.Second), ErrCertExpired},
		{"not yet valid", good.cert, t0().Add(-ClockSkew - time.Second), ErrCertExpired},
		{"twin CA", issue(t, twin, NodeIdentity("n", 1), ttl).cert, t0(), ErrUnknownCA},
		{"other CA", issue(t, other, NodeIdentity("n", 1), ttl).cert, t0(), ErrUnknownCA},
		{"the CA itself", ca.Certificate().Raw, t0(), ErrBadIdentity},
		{"garbage", []byte("junk"), t0(), ErrCertInvalid},
		{"empty", nil, t0(), ErrCertInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cert, id, err := ca.Verify(tt.cert, tt.at)
			wantErr(t, err, tt.want)
			if tt.want != nil && (cert != nil || id != (Identity{})) {
				t.Fatal("certificate or identity returned with an error")
			}
		})
	}
}

// VerifyCert checks a parsed certificate as Verify checks its DER, and the certificate it keeps
// for later calls (Verify's too) is the one it was given, not a second parse.
func TestVerifyCertKeepsTheCertificateItWasGiven(t *testing.T) {
	ca := newCA(t)
	other, err := CreateCA("other CA", t0())
	if err != nil {
		t.Fatal(err)
	}
	const ttl = time.Hour
	issued := issue(t, ca, NodeIdentity("n", 1), ttl).cert
	// Issued by this CA, but not in its memory of what it issued (another process's CA, the
	// same key): the full checks run on the parsed certificate.
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	restarted, err := LoadCA(ca.CertPEM(), keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		ca   *CA
		cert []byte
		at   time.Time
		want error
	}{
		{"issued here", ca, issued, t0(), nil},
		{"verified in full", restarted, issued, t0(), nil},
		{"expired", ca, issue(t, ca, NodeIdentity("m", 1), ttl).cert, t0().Add(ttl + time.Second), ErrCertExpired},
		{"another CA's", ca, issue(t, other, NodeIdentity("n", 1), ttl).cert, t0(), ErrUnknownCA},
		{"the CA itself", ca, ca.Certificate().Raw, t0(), ErrBadIdentity},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			given := parse(t, tt.cert)
			cert, id, err := tt.ca.VerifyCert(given, tt.at)
			wantErr(t, err, tt.want)
			_, wantID, werr := tt.ca.Verify(tt.cert, tt.at)
			wantErr(t, werr, tt.want)
			if tt.want != nil {
				return
			}
			if cert != given || id != wantID {
				t.Fatalf("VerifyCert: %p %v, want the certificate given (%p) and %v", cert, id, given, wantID)
			}
			// Verify of the same DER afterwards finds the certificate given, kept.
			again, _, err := tt.ca.Verify(tt.cert, tt.at)
			if err != nil || again != given {
				t.Fatalf("Verify after VerifyCert: %p %v, want the certificate given (%p)", again, err, given)
			}
		})
	}
	if _, _, err := ca.VerifyCert(nil, t0()); !errors.Is(err, ErrCertInvalid) {
		t.Errorf("no certificate: %v, want ErrCertInvalid", err)
	}
}

// assertNoKeyMaterial fails if s contains any line of the PEM bodies of keys.
func assertNoKeyMaterial(t *testing.T, s string, keys ...[]byte) {
	t.Helper()
	for _, k := range keys {
		for _, line := range strings.Split(string(k), "\n") {
			if len(line) >= 16 && !strings.HasPrefix(line, "-----") && strings.Contains(s, line) {
				t.Fatalf("key material %q found in %q", line, s)
			}
		}
	}
}

func TestCANeverShowsItsKey(t *testing.T) {
	ca := newCA(t)
	keyPEM, _ := ca.KeyPEM()
	d := ca.signer().key.D.String()
	dHex := fmt.Sprintf("%x", ca.signer().key.D)
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	log.Info("ca loaded", "ca", ca)
	slog.New(slog.NewTextHandler(&logs, nil)).Info("ca loaded", "ca", ca)
	log.Info("ca value", "ca", *ca)
	outputs := []string{
		ca.String(),
		fmt.Sprintf("%v %+v %#v %s", ca, ca, ca, ca),
		fmt.Sprintf("%v %+v %#v %s", *ca, *ca, *ca, *ca),
		logs.String(),
	}
	for i, out := range outputs {
		assertNoKeyMaterial(t, out, keyPEM)
		if strings.Contains(out, d) || strings.Contains(out, dHex) {
			t.Fatalf("output %d contains the CA private scalar: %s", i, out)
		}
	}
	out := logs.String()
	if !strings.Contains(out, ca.Fingerprint()) {
		t.Fatalf("log does not name the CA: %s", out)
	}
}
