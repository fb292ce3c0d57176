package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"testing"
	"time"
)

// onlySigner hides a signer's SignMessage: x509 then signs a digest through Sign.
type onlySigner struct{ crypto.Signer }

// TestSignedByIsWhatX509Makes: what signedBy makes is x509's own encoding, byte for byte up to
// the signature (ECDSA signatures are randomised), and verifies; a signature altered after
// signing does not.
func TestSignedByIsWhatX509Makes(t *testing.T) {
	ca := newCA(t)
	signer := ca.signer()
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	uri, _ := url.Parse("bcd://node/n1?generation=3")
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(424242),
		Subject:               pkix.Name{CommonName: "node n1", Organization: []string{"bcd"}},
		NotBefore:             t0(),
		NotAfter:              t0().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		SubjectKeyId:          []byte{1, 2, 3, 4},
		URIs:                  []*url.URL{uri},
	}
	certWith := func(s crypto.Signer) ([]byte, error) {
		return x509.CreateCertificate(rand.Reader, tmpl, signer.cert, &leafKey.PublicKey, s)
	}
	csrWith := func(s crypto.Signer) ([]byte, error) {
		return x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "agent"}}, s)
	}
	csrKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}

	type parts struct{ tbs, sig []byte }
	parseCert := func(t *testing.T, der []byte) parts {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatalf("parsing the certificate: %v", err)
		}
		if c.SignatureAlgorithm != x509.ECDSAWithSHA256 {
			t.Fatalf("signature algorithm %v", c.SignatureAlgorithm)
		}
		if err := c.CheckSignatureFrom(signer.cert); err != nil {
			t.Fatalf("the certificate does not verify against its CA: %v", err)
		}
		return parts{c.RawTBSCertificate, c.Signature}
	}
	parseCSR := func(t *testing.T, der []byte) parts {
		c, err := x509.ParseCertificateRequest(der)
		if err != nil {
			t.Fatalf("parsing the request: %v", err)
		}
		if err := c.CheckSignature(); err != nil {
			t.Fatalf("the request does not verify: %v", err)
		}
		return parts{c.RawTBSCertificateRequest, c.Signature}
	}
	for _, tc := range []struct {
		name   string
		key    *ecdsa.PrivateKey
		create func(crypto.Signer) ([]byte, error)
		parse  func(*testing.T, []byte) parts
	}{
		{"certificate", signer.key, certWith, parseCert},
		{"certificate request", csrKey, csrWith, parseCSR},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := tc.create(tc.key)
			if err != nil {
				t.Fatal(err)
			}
			got, err := signedBy(tc.key, tc.create)
			if err != nil {
				t.Fatalf("signedBy: %v", err)
			}
			g, w := tc.parse(t, got), tc.parse(t, want)
			if !bytes.Equal(g.tbs, w.tbs) {
				t.Fatal("the signed part differs from x509's")
			}
			// The same outer form: only the signature (and so its length) differs.
			if len(got)-len(g.sig) != len(want)-len(w.sig) {
				t.Fatalf("outer form: %d bytes around the signature, x509's %d", len(got)-len(g.sig), len(want)-len(w.sig))
			}
			// Through Sign (an x509 that would hand over a digest): x509 signs and checks.
			viaSign, err := signedBy(tc.key, func(s crypto.Signer) ([]byte, error) { return tc.create(onlySigner{s}) })
			if err != nil {
				t.Fatalf("signedBy through Sign: %v", err)
			}
			if s := tc.parse(t, viaSign); !bytes.Equal(s.tbs, w.tbs) {
				t.Fatal("through Sign: the signed part differs from x509's")
			}
			// A flipped bit in the signature is caught by the parsers' checks (the test can fail).
			bad := bytes.Clone(got)
			bad[len(bad)-3] ^= 1
			if c, err := x509.ParseCertificate(bad); err == nil && c.CheckSignatureFrom(signer.cert) == nil {
				t.Fatal("an altered certificate verified")
			}
			if c, err := x509.ParseCertificateRequest(bad); err == nil && c.CheckSignature() == nil {
				t.Fatal("an altered request verified")
			}
		})
	}

	t.Run("errors", func(t *testing.T) {
		boom := errors.New("boom")
		if _, err := signedBy(signer.key, func(crypto.Signer) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
			t.Fatalf("create's own error: got %v", err)
		}
		p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []*ecdsa.PrivateKey{nil, p384} {
			if _, err := signedBy(k, certWith); !errors.Is(err, ErrBadInput) {
				t.Fatalf("key %v: got %v, want ErrBadInput", k != nil, err)
			}
		}
		// A part that is not one DER sequence is refused, never wrapped.
		if _, err := signedBy(signer.key, func(s crypto.Signer) ([]byte, error) {
			return s.(crypto.MessageSigner).SignMessage(rand.Reader, []byte("not DER"), crypto.SHA256)
		}); err == nil || errors.Is(err, errTBSSigned) {
			t.Fatalf("a part that is not DER: got %v", err)
		}
		if _, err := signedBy(signer.key, func(s crypto.Signer) ([]byte, error) {
			return s.(crypto.MessageSigner).SignMessage(rand.Reader, []byte{0x30, 0}, crypto.SHA384)
		}); err == nil || errors.Is(err, errTBSSigned) {
			t.Fatalf("SHA-384: got %v", err)
		}
	})
}

// TestVerifyTakesWhatThisCAIssued: a certificate this CA signed is accepted without its
// signature being checked again, and still refused when its issuer is no longer trusted or
// it is out of its window; a certificate the CA did not sign here is checked in full.
func TestVerifyTakesWhatThisCAIssued(t *testing.T) {
	ca := newCA(t)
	id := NodeIdentity("n1", 4)
	leaf := issue(t, ca, id, time.Hour)
	key := sha256.Sum256(leaf.cert)
	if fp, ok := ca.st.issued.Get(key); !ok || fp != ca.Fingerprint() {
		t.Fatalf("issued: %q %v, want the active CA's fingerprint", fp, ok)
	}
	_, got, err := ca.Verify(leaf.cert, t0())
	if err != nil || got != id {
		t.Fatalf("Verify: %v %v, want %v", got, err, id)
	}
	if _, ok := ca.st.certs.Get(key); !ok {
		t.Fatal("the certificate taken from issued is not kept with those verified")
	}
	_, _, err = ca.Verify(leaf.cert, t0().Add(2*time.Hour))
	wantErr(t, err, ErrCertExpired)

	// Issued by another CA that has this one's name and was never trusted here: issued holds
	// nothing for it, and the full check refuses it.
	other := newCA(t)
	stranger := issue(t, other, id, time.Hour)
	_, _, err = ca.Verify(stranger.cert, t0())
	wantErr(t, err, ErrUnknownCA)

	// Remembered as issued by a CA that is then no longer trusted (a rotation to B, B's
	// certificate issued, then back to A alone): refused.
	r := newRotation(t)
	r.stage(t, "overlap")
	byB := issue(t, r.ca, id, time.Hour)
	if _, _, err := r.ca.Verify(byB.cert, t0()); err != nil {
		t.Fatalf("during the overlap: %v", err)
	}
	r.stage(t, "steady")
	if _, ok := r.ca.st.issued.Get(sha256.Sum256(byB.cert)); !ok {
		t.Fatal("B's certificate is not remembered as issued")
	}
	_, _, err = r.ca.Verify(byB.cert, t0())
	wantErr(t, err, ErrUnknownCA)
}
