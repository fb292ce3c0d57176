package pki

import (
	"crypto/tls"
	"crypto/x509"
	"slices"
	"strings"
	"testing"
	"time"
)

// rotation is a test's two CAs, A (the installation's first) and B (the next one), and a CA
// whose set the test moves through a rotation's stages.
type rotation struct {
	a, b, ca *CA
}

func newRotation(t *testing.T) rotation {
	t.Helper()
	a := newCA(t)
	b, err := CreateCA("next CA", t0())
	if err != nil {
		t.Fatal(err)
	}
	// ca starts as A alone; a and b are never changed (SetRotation copies what it needs).
	keyA, _ := a.KeyPEM()
	ca, err := LoadCA(a.CertPEM(), keyA)
	if err != nil {
		t.Fatal(err)
	}
	return rotation{a: a, b: b, ca: ca}
}

// stage sets r.ca to one of the stages: steady (A), staged (A signs, B next), overlap (B
// signs, A previous), finished (B).
func (r rotation) stage(t *testing.T, st string) {
	t.Helper()
	var err error
	switch st {
	case "steady":
		err = r.ca.SetRotation(r.a, nil, nil)
	case "staged":
		err = r.ca.SetRotation(r.a, r.b, nil)
	case "overlap":
		err = r.ca.SetRotation(r.b, nil, r.a.CertPEM())
	case "finished":
		err = r.ca.SetRotation(r.b, nil, nil)
	default:
		t.Fatalf("stage %q", st)
	}
	if err != nil {
		t.Fatalf("stage %s: %v", st, err)
	}
}

// TestRotationVerifiesAgainstTheSet: at each stage, certificates of every trusted CA verify and
// those of a CA no longer trusted do not, even when verified (and remembered) before; the
// bundle handed out and the fingerprints told agents list exactly the trusted CAs, the signer
// first; the signer issues.
func TestRotationVerifiesAgainstTheSet(t *testing.T) {
	r := newRotation(t)
	node := NodeIdentity("n1", 1)
	byA := issue(t, r.a, node, time.Hour)
	byB := issue(t, r.b, node, time.Hour)
	fpA, fpB := r.a.Fingerprint(), r.b.Fingerprint()
	for _, tc := range []struct {
		stage          string
		acceptA        bool
		acceptB        bool
		signer         string
		trusted        []string
		wantStageLabel string
	}{
		{"steady", true, false, fpA, []string{fpA}, StageSteady},
		{"staged", true, true, fpA, []string{fpA, fpB}, StageStaged},
		{"overlap", true, true, fpB, []string{fpB, fpA}, StageOverlap},
		{"finished", false, true, fpB, []string{fpB}, StageSteady},
		{"steady", true, false, fpA, []string{fpA}, StageSteady}, // back: B's certificates, remembered, are refused
	} {
		t.Run(tc.stage, func(t *testing.T) {
			r.stage(t, tc.stage)
			for _, c := range []struct {
				name   string
				der    []byte
				accept bool
			}{{"A's", byA.cert, tc.acceptA}, {"B's", byB.cert, tc.acceptB}} {
				_, _, err := r.ca.Verify(c.der, t0())
				if c.accept {
					wantErr(t, err, nil)
				} else {
					wantErr(t, err, ErrUnknownCA)
				}
				if got := r.ca.IssuerOf(c.der) != ""; got != c.accept {
					t.Errorf("IssuerOf(%s certificate) found = %v, want %v", c.name, got, c.accept)
				}
			}
			if got := r.ca.Trusted(); !slices.Equal(got, tc.trusted) {
				t.Errorf("Trusted = %v, want %v", got, tc.trusted)
			}
			if got := BundleFingerprints(r.ca.CertPEM()); !slices.Equal(got, tc.trusted) {
				t.Errorf("CertPEM holds %v, want %v", got, tc.trusted)
			}
			if r.ca.Fingerprint() != tc.signer {
				t.Errorf("signer %s, want %s", r.ca.Fingerprint(), tc.signer)
			}
			if got := r.ca.Rotation().Stage(); got != tc.wantStageLabel {
				t.Errorf("stage %q, want %q", got, tc.wantStageLabel)
			}
			leaf := issue(t, r.ca, SiteAgentIdentity("s", "a"), time.Hour)
			cert, _ := x509.ParseCertificate(leaf.cert)
			if got := r.ca.IssuerOf(leaf.cert); got != tc.signer || IssuerInBundle(cert, r.ca.CertPEM()) != tc.signer {
				t.Errorf("a new certificate is issued by %s, want the signer %s", got, tc.signer)
			}
			// A renewal certifies again with the signer, whichever trusted CA issued the old one.
			if tc.acceptA {
				der, err := r.ca.Renew(byA.cert, time.Hour, t0())
				wantErr(t, err, nil)
				if got := r.ca.IssuerOf(der); got != tc.signer {
					t.Errorf("renewal issued by %s, want %s", got, tc.signer)
				}
			}
		})
	}
}

// TestRotationAttestationDuringOverlap: a node's result signed with a certificate of the
// previous CA verifies while that CA is still trusted, and not once the rotation finished.
func TestRotationAttestationDuringOverlap(t *testing.T) {
	r := newRotation(t)
	node := issue(t, r.a, NodeIdentity("n1", 3), time.Hour)
	st := Statement{CommandID: "c1", NodeID: "n1", Kind: "disk.wipe", Generation: 3, ResultSHA256: ResultDigest([]byte(`{"ok":true}`))}
	sig, err := SignStatement(node.key, st)
	if err != nil {
		t.Fatal(err)
	}
	r.stage(t, "overlap")
	wantErr(t, VerifyStatement(r.ca, node.cert, st, sig, 3, t0()), nil)
	r.stage(t, "finished")
	wantErr(t, VerifyStatement(r.ca, node.cert, st, sig, 3, t0()), ErrUnknownCA)
}

// TestSetRotationRefuses: a next and a previous CA at once, a next or previous CA that is the
// active one, and a previous "CA" that is not a CA.
func TestSetRotationRefuses(t *testing.T) {
	r := newRotation(t)
	leaf := issue(t, r.a, SiteAgentIdentity("s", "a"), time.Hour)
	for name, f := range map[string]func() error{
		"next and previous":  func() error { return r.ca.SetRotation(r.a, r.b, r.b.CertPEM()) },
		"next is active":     func() error { return r.ca.SetRotation(r.a, r.a, nil) },
		"previous is active": func() error { return r.ca.SetRotation(r.b, nil, r.b.CertPEM()) },
		"previous not a CA":  func() error { return r.ca.SetRotation(r.b, nil, EncodeCertPEM(leaf.cert)) },
		"previous not PEM":   func() error { return r.ca.SetRotation(r.b, nil, []byte("garbage")) },
		"no active":          func() error { return r.ca.SetRotation(nil, r.b, nil) },
	} {
		if err := f(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if r.ca.Fingerprint() != r.a.Fingerprint() || len(r.ca.Trusted()) != 1 {
		t.Fatal("a refused SetRotation changed the CA")
	}
}

// TestServerCertFollowsActivation: the gateway's certificate is issued again by the new signer
// at the first handshake after an activation, and client certificates are verified against the
// CAs trusted at each handshake.
func TestServerCertFollowsActivation(t *testing.T) {
	r := newRotation(t)
	sc, err := NewServerCert(r.ca, []string{"127.0.0.1"}, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	issuer := func() string {
		t.Helper()
		c, err := sc.Current()
		if err != nil {
			t.Fatal(err)
		}
		return r.ca.IssuerOf(c.Certificate[0])
	}
	cfg := sc.TLSConfig()
	pool := func() *x509.CertPool {
		t.Helper()
		c, err := cfg.GetConfigForClient(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		if c == nil {
			return cfg.ClientCAs
		}
		return c.ClientCAs
	}
	if issuer() != r.a.Fingerprint() || !pool().Equal(r.a.Pool()) {
		t.Fatal("steady: not A's")
	}
	r.stage(t, "staged")
	if issuer() != r.a.Fingerprint() {
		t.Error("staged: the next CA signed the server's certificate")
	}
	both := r.a.Pool()
	both.AddCert(r.b.Certificate())
	if !pool().Equal(both) {
		t.Error("staged: client certificates are not verified against both CAs")
	}
	r.stage(t, "overlap")
	if issuer() != r.b.Fingerprint() {
		t.Error("overlap: the server's certificate was not issued again by the new signer")
	}
	r.stage(t, "finished")
	if !pool().Equal(r.b.Pool()) {
		t.Error("finished: the previous CA still verifies client certificates")
	}
}

// TestCheckBundle: an agent takes a bundle of CA certificates one of which issued its own,
// and nothing else: the bundle becomes its CA file, which the site agent passes to the ramdisks
// it boots (bcd.ca, held to the same form by the ramdisk and to the kernel command line's
// length), so text, other PEM blocks, a certificate that does not parse, or more CAs than a
// rotation ever trusts at once are refused, never kept.
func TestCheckBundle(t *testing.T) {
	r := newRotation(t)
	leafDER := issue(t, r.a, SiteAgentIdentity("s", "a"), time.Hour).cert
	leaf, _ := x509.ParseCertificate(leafDER)
	both := append(r.a.CertPEM(), r.b.CertPEM()...)
	keyPEM, err := r.b.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	many := slices.Clone(both)
	for range 30 {
		many = append(many, newCA(t).CertPEM()...)
	}
	corrupt := []byte(strings.Replace(string(r.b.CertPEM()), "\n", "\nAAAA", 2))
	withHeader := []byte(strings.Replace(string(r.b.CertPEM()), "-----\n", "-----\nProc-Type: 4,ENCRYPTED\n\n", 1))
	for _, tc := range []struct {
		name   string
		bundle []byte
		ok     bool
	}{
		{"both", both, true},
		{"its issuer alone", r.a.CertPEM(), true},
		{"another CA only", r.b.CertPEM(), false},
		{"empty", nil, false},
		{"a leaf inside", append(both, EncodeCertPEM(leafDER)...), false},
		{"surrounded by blank lines", append(append([]byte("\n\n"), both...), "\n\n"...), true},
		{"three CAs", append(slices.Clone(both), newCA(t).CertPEM()...), false},
		{"larger than a rotation's", many, false},
		{"text outside the certificates", append([]byte("trust these:\n"), both...), false},
		{"a private key inside", append(slices.Clone(both), keyPEM...), false},
		{"a certificate that does not parse", append(r.a.CertPEM(), corrupt...), false},
		{"a certificate with PEM headers", append(r.a.CertPEM(), withHeader...), false},
	} {
		err := CheckBundle(tc.bundle, leaf)
		if (err == nil) != tc.ok {
			t.Errorf("%s: CheckBundle = %v, want ok %v", tc.name, err, tc.ok)
		}
		if err != nil && strings.Contains(err.Error(), "PRIVATE") {
			t.Errorf("%s: error shows key material", tc.name)
		}
	}
}

// TestRetiredCAsServeAudits: after a rotation finished, a result attested under the retired CA
// is refused live (VerifyStatement) and accepted by an audit (VerifyRecordedStatement) once the
// retired CA is kept (SetRetired), at the time it was received; a CA that was never the
// installation's, a forged signature, or a certificate not valid when the result arrived are
// refused by the audit too. AuditPEM lists the retired CA after the trusted ones.
func TestRetiredCAsServeAudits(t *testing.T) {
	r := newRotation(t)
	node := issue(t, r.a, NodeIdentity("n1", 3), time.Hour)
	stranger := issue(t, newCA(t), NodeIdentity("n1", 3), time.Hour)
	st := Statement{CommandID: "c1", NodeID: "n1", Kind: "disk.wipe", Generation: 3, ResultSHA256: ResultDigest([]byte(`{"ok":true}`))}
	sig, err := SignStatement(node.key, st)
	if err != nil {
		t.Fatal(err)
	}
	strangerSig, err := SignStatement(stranger.key, st)
	if err != nil {
		t.Fatal(err)
	}
	r.stage(t, "finished")
	wantErr(t, VerifyRecordedStatement(r.ca, node.cert, st, sig, 3, t0()), ErrUnknownCA) // not kept yet
	if err := r.ca.SetRetired(r.a.CertPEM()); err != nil {
		t.Fatal(err)
	}
	forged := slices.Clone(sig)
	forged[len(forged)-1] ^= 1
	for _, tc := range []struct {
		name string
		cert []byte
		sig  []byte
		at   time.Time
		want error
	}{
		{"under the retired CA", node.cert, sig, t0(), nil},
		{"forged signature", node.cert, forged, t0(), ErrBadSignature},
		{"certificate expired when the result arrived", node.cert, sig, t0().Add(2 * time.Hour), ErrCertExpired},
		{"a CA never the installation's", stranger.cert, strangerSig, t0(), ErrUnknownCA},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, VerifyRecordedStatement(r.ca, tc.cert, st, tc.sig, 3, tc.at), tc.want)
		})
	}
	wantErr(t, VerifyStatement(r.ca, node.cert, st, sig, 3, t0()), ErrUnknownCA) // never live
	if got, want := string(r.ca.AuditPEM()), string(r.b.CertPEM())+string(r.a.CertPEM()); got != want {
		t.Errorf("AuditPEM = %q, want the trusted CA then the retired one", got)
	}
	if err := r.ca.SetRetired([]byte("not pem")); err == nil {
		t.Error("SetRetired accepted a bundle that is not PEM")
	}

	// Retired with its time: what arrived before is audited, what arrived after is refused.
	retired, err := RetiredPEM(r.a.CertPEM(), t0().Add(30*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.ca.SetRetired(retired); err != nil {
		t.Fatal(err)
	}
	wantErr(t, VerifyRecordedStatement(r.ca, node.cert, st, sig, 3, t0().Add(10*time.Minute)), nil)
	wantErr(t, VerifyRecordedStatement(r.ca, node.cert, st, sig, 3, t0().Add(45*time.Minute)), ErrUnknownCA)
	if got := string(r.ca.AuditPEM()); strings.Contains(got, RetiredAtHeader) {
		t.Errorf("AuditPEM carries the %s header: %q", RetiredAtHeader, got)
	}
	bad := strings.Replace(string(retired), t0().Add(30*time.Minute).UTC().Format(time.RFC3339Nano), "yesterday", 1)
	if err := r.ca.SetRetired([]byte(bad)); err == nil {
		t.Error("SetRetired accepted a retirement time that does not parse")
	}
}
