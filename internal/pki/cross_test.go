package pki

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"sync"
	"testing"
	"time"
)

// crossRotation is a rotation from A to B on the real clock (the handshakes below verify at
// the time they run), with a server certificate whose clock the test moves.
type crossRotation struct {
	a, b, ca *CA
	sc       *ServerCert
	mu       sync.Mutex
	now      time.Time
}

func newCrossRotation(t *testing.T) *crossRotation {
	t.Helper()
	now := time.Now()
	a, err := CreateCA("old CA", now.Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	b, err := CreateCA("new CA", now.Add(-time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	keyA, _ := a.KeyPEM()
	ca, err := LoadCA(a.CertPEM(), keyA)
	if err != nil {
		t.Fatal(err)
	}
	r := &crossRotation{a: a, b: b, ca: ca, now: now}
	if r.sc, err = NewServerCert(ca, []string{"127.0.0.1"}, time.Hour, r.clock); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *crossRotation) clock() time.Time { r.mu.Lock(); defer r.mu.Unlock(); return r.now }

func (r *crossRotation) advance(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.now = r.now.Add(d)
}

// stage moves the CA as the servers do from the stored row: overlap is the activated row, the
// previous CA's certificate followed by B cross-signed by A (made at the activation).
func (r *crossRotation) stage(t *testing.T, st string) {
	t.Helper()
	var err error
	switch st {
	case "steady":
		err = r.ca.SetRotation(r.a, nil, nil)
	case "staged":
		err = r.ca.SetRotation(r.a, r.b, nil)
	case "overlap":
		var cross []byte
		if cross, err = r.a.CrossSign(r.b.CertPEM()); err == nil {
			err = r.ca.SetRotation(r.b, nil, append(r.a.CertPEM(), cross...))
		}
	case "finished":
		err = r.ca.SetRotation(r.b, nil, nil)
	default:
		t.Fatalf("stage %q", st)
	}
	if err != nil {
		t.Fatalf("stage %s: %v", st, err)
	}
}

// handshake connects to a server serving r.sc as an agent trusting caPEM does, and returns the
// chain the server presented.
func (r *crossRotation) handshake(t *testing.T, caPEM []byte) ([][]byte, error) {
	t.Helper()
	addr, res := serveOnce(t, r.sc.TLSConfig())
	cfg := ClientTLSConfig(caPEM, tls.Certificate{})
	cfg.ServerName = "127.0.0.1"
	cfg.Time = r.clock // the agent's clock moves with the server's
	var chain [][]byte
	cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error { chain = raw; return nil }
	err := dial(addr, cfg)
	<-res // the server's side ends with the client's verdict
	return chain, err
}

// TestGatewayChainForAgentsOfThePreviousCA: an agent trusting only the CA of before a rotation
// (away since before bcd ca rotate) verifies the gateway at every stage until the rotation
// finishes: during the overlap through the new CA cross-signed by the old one, which the
// gateway presents after its own certificate, also once that is renewed. After finish no
// cross-signed certificate is sent and that agent is refused; agents trusting the new CA, or
// both, verify the gateway whenever it presents a certificate of a CA they hold.
func TestGatewayChainForAgentsOfThePreviousCA(t *testing.T) {
	r := newCrossRotation(t)
	both := append(r.a.CertPEM(), r.b.CertPEM()...)
	for _, tc := range []struct {
		stage              string
		renew              bool // the gateway's certificate is renewed before the handshakes
		chainLen           int
		oldOK, newOK, both bool
	}{
		{"steady", false, 1, true, false, true},
		{"staged", false, 1, true, false, true},
		{"overlap", false, 2, true, true, true},
		{"overlap", true, 2, true, true, true},
		{"finished", false, 1, false, true, true},
		{"finished", true, 1, false, true, true},
	} {
		name := tc.stage
		if tc.renew {
			name += "/renewed"
		}
		t.Run(name, func(t *testing.T) {
			r.stage(t, tc.stage)
			before, err := r.sc.Current()
			if err != nil {
				t.Fatal(err)
			}
			if tc.renew {
				r.advance(45 * time.Minute) // past two thirds of the hour it lives
			}
			chain, err := r.handshake(t, r.a.CertPEM())
			if (err == nil) != tc.oldOK {
				t.Fatalf("an agent trusting only the previous CA: err = %v, want success %v", err, tc.oldOK)
			}
			if tc.oldOK && len(chain) != tc.chainLen {
				t.Fatalf("the gateway presented %d certificates, want %d", len(chain), tc.chainLen)
			}
			if _, err := r.handshake(t, r.b.CertPEM()); (err == nil) != tc.newOK {
				t.Fatalf("an agent trusting only the new CA: err = %v, want success %v", err, tc.newOK)
			}
			chain, err = r.handshake(t, both)
			if (err == nil) != tc.both {
				t.Fatalf("an agent trusting both CAs: err = %v, want success %v", err, tc.both)
			}
			if len(chain) != tc.chainLen {
				t.Fatalf("the gateway presented %d certificates, want %d", len(chain), tc.chainLen)
			}
			if renewed := !bytes.Equal(chain[0], before.Certificate[0]); renewed != tc.renew {
				t.Fatalf("the gateway's certificate renewed: %v, want %v", renewed, tc.renew)
			}
			if tc.chainLen == 2 {
				cross, err := x509.ParseCertificate(chain[1])
				if err != nil {
					t.Fatal(err)
				}
				b := r.b.Certificate()
				if !bytes.Equal(cross.RawSubject, b.RawSubject) || !bytes.Equal(cross.RawSubjectPublicKeyInfo, b.RawSubjectPublicKeyInfo) ||
					cross.CheckSignatureFrom(r.a.Certificate()) != nil || !cross.IsCA || cross.MaxPathLen != 0 {
					t.Fatal("the intermediate presented is not the new CA cross-signed by the previous one")
				}
			}
		})
	}
}

// TestCrossSign: the cross-signed certificate names the new CA's subject and key, is issued by
// the previous CA within both CAs' validity, signs leaves only, and is never trusted or handed
// out by the servers; SetRotation takes it only as the active CA signed by the previous one.
func TestCrossSign(t *testing.T) {
	r := newRotation(t)
	crossPEM, err := r.a.CrossSign(r.b.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	der, err := DecodeCertPEM(crossPEM)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	a, b := r.a.Certificate(), r.b.Certificate()
	switch {
	case !bytes.Equal(c.RawSubject, b.RawSubject) || !bytes.Equal(c.RawSubjectPublicKeyInfo, b.RawSubjectPublicKeyInfo) || !bytes.Equal(c.SubjectKeyId, b.SubjectKeyId):
		t.Error("not the new CA's subject, key and key id")
	case !bytes.Equal(c.RawIssuer, a.RawSubject) || c.CheckSignatureFrom(a) != nil || !bytes.Equal(c.AuthorityKeyId, a.SubjectKeyId):
		t.Error("not issued by the previous CA")
	case c.NotBefore.Before(a.NotBefore) || c.NotAfter.After(a.NotAfter) || c.NotBefore.Before(b.NotBefore) || c.NotAfter.After(b.NotAfter):
		t.Errorf("valid %s to %s, outside a CA's validity", c.NotBefore, c.NotAfter)
	case !c.IsCA || c.MaxPathLen != 0 || !c.MaxPathLenZero || c.KeyUsage&x509.KeyUsageCertSign == 0:
		t.Error("not a CA certificate signing leaves only")
	}
	if _, err := r.a.CrossSign(r.a.CertPEM()); err == nil {
		t.Error("a CA cross-signed itself")
	}
	if err := r.ca.SetRotation(r.b, nil, append(r.a.CertPEM(), crossPEM...)); err != nil {
		t.Fatal(err)
	}
	if got := r.ca.Rotation().Cross; got == nil || !got.Equal(c) {
		t.Error("Rotation does not show the cross-signed CA")
	}
	want := r.b.Pool()
	want.AddCert(a)
	if fps := BundleFingerprints(r.ca.CertPEM()); len(fps) != 2 || fps[0] != r.b.Fingerprint() || fps[1] != r.a.Fingerprint() || !r.ca.Pool().Equal(want) {
		t.Errorf("the cross-signed CA is trusted or handed out: the bundle holds %d certificates", len(fps))
	}
	other := newCA(t)
	byOther, err := other.CrossSign(r.b.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	ofA, err := r.b.CrossSign(r.a.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	for name, previousPEM := range map[string][]byte{
		"signed by another CA":       append(r.a.CertPEM(), byOther...),
		"not the active CA":          append(r.a.CertPEM(), ofA...),
		"the previous CA twice":      append(r.a.CertPEM(), r.a.CertPEM()...),
		"more than one cross-signed": append(append(r.a.CertPEM(), crossPEM...), crossPEM...),
	} {
		if err := r.ca.SetRotation(r.b, nil, previousPEM); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if got := r.ca.Rotation().Cross; got == nil || !got.Equal(c) {
		t.Error("a refused SetRotation changed the cross-signed CA")
	}
	if err := r.ca.SetRotation(r.b, nil, nil); err != nil || r.ca.Rotation().Cross != nil {
		t.Errorf("finished: cross-signed CA %v, err %v", r.ca.Rotation().Cross != nil, err)
	}
}
