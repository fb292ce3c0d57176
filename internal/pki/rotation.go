package pki

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"slices"
	"time"
)

// Rotation is where a rotation of the CA stands: the active CA signs; Next, when set, is
// staged (trusted and handed out, not signing yet); Previous, when set, is the retired signer,
// trusted until the rotation finishes. At most one of Next and Previous is set. Cross, with
// Previous only, is the active CA cross-signed by the previous one (CrossSign): the
// intermediate the gateway presents after its own certificate, so that an agent holding only
// the previous CA still verifies the gateway.
type Rotation struct {
	Active, Next, Previous *x509.Certificate
	Cross                  *x509.Certificate
}

// Stage names the rotation's stage: "steady" (one CA), "staged" (a next CA is trusted, the
// active one signs) or "overlap" (the new CA signs, the previous one is still trusted).
func (r Rotation) Stage() string {
	switch {
	case r.Next != nil:
		return StageStaged
	case r.Previous != nil:
		return StageOverlap
	default:
		return StageSteady
	}
}

// Stages of a rotation (Rotation.Stage).
const (
	StageSteady  = "steady"
	StageStaged  = "staged"
	StageOverlap = "overlap"
)

// Rotation returns the CAs in force now.
func (ca *CA) Rotation() Rotation {
	s := ca.current()
	r := Rotation{Active: s.active.cert}
	if s.next != nil {
		r.Next = s.next.cert
	}
	if s.previous != nil {
		r.Previous = s.previous.cert
	}
	r.Cross = s.cross
	return r
}

// Trusted lists the fingerprints (Fingerprint) of the CAs trusted now, the active one first.
func (ca *CA) Trusted() []string { return slices.Clone(ca.current().fps) }

// SetRotation replaces what ca signs with and trusts, at once for every caller: active signs
// from now on; next (staged: trusted and in CertPEM, not signing yet) and previousPEM (the
// retired signer's certificate: trusted, never signing) are optional and exclusive. previousPEM
// may go on with the active CA cross-signed by the previous one (CrossSign, made at the
// activation): ServerCert presents it after the gateway's certificate. active and next must
// hold their keys (LoadCA); the previous CA's key is not kept. Certificates verified before
// stay accepted only while their issuer is still trusted.
func (ca *CA) SetRotation(active, next *CA, previousPEM []byte) error {
	if active == nil {
		return fmt.Errorf("setting the CA rotation: %w: no active CA", ErrBadInput)
	}
	if next != nil && len(previousPEM) > 0 {
		return fmt.Errorf("setting the CA rotation: %w: a next and a previous CA at once (finish the rotation before staging another)", ErrBadInput)
	}
	act := active.signer()
	var nxt, prev *authority
	var cross *x509.Certificate
	if next != nil {
		nxt = next.signer()
		if nxt.fp == act.fp {
			return fmt.Errorf("setting the CA rotation: %w: the next CA is the active one", ErrBadInput)
		}
	}
	if len(previousPEM) > 0 {
		cert, der, err := ParseCACertPEM(previousPEM)
		if err != nil {
			return fmt.Errorf("setting the CA rotation: the previous CA: %w", err)
		}
		prev = authorityOf(cert, der, nil)
		if prev.fp == act.fp {
			return fmt.Errorf("setting the CA rotation: %w: the previous CA is the active one", ErrBadInput)
		}
		if cross, err = crossOf(previousPEM, act.cert, prev.cert); err != nil {
			return fmt.Errorf("setting the CA rotation: %w", err)
		}
	}
	s := newSet(act, nxt, prev)
	s.cross = cross
	ca.st.set.Store(s)
	return nil
}

// CrossSign certifies the CA of certPEM (its subject, key and key identifier, unchanged) under
// ca's active CA: the cross-signed certificate a rotation's activation makes with the CA it
// retires, for the gateway to present after its own certificate until the rotation finishes.
// An agent that trusts only the retired CA (away since before the rotation) then verifies the
// gateway through it, reaches it, and is handed the new CA. The certificate is valid while both
// CAs are, may sign leaf certificates only (path length 0), and is never trusted as a CA by the
// servers: it is not in CertPEM, Pool or any bundle handed out.
func (ca *CA) CrossSign(certPEM []byte) ([]byte, error) {
	signer := ca.signer()
	sub, _, err := ParseCACertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("cross-signing a CA: %w", err)
	}
	if bytes.Equal(sub.Raw, signer.cert.Raw) {
		return nil, fmt.Errorf("cross-signing a CA: %w: the CA is the signer itself", ErrBadInput)
	}
	notBefore, notAfter := sub.NotBefore, sub.NotAfter
	if signer.cert.NotBefore.After(notBefore) {
		notBefore = signer.cert.NotBefore
	}
	if signer.cert.NotAfter.Before(notAfter) {
		notAfter = signer.cert.NotAfter
	}
	if !notBefore.Before(notAfter) {
		return nil, fmt.Errorf("cross-signing CA %q: %w: it and the signer %q are never valid at once", sub.Subject.CommonName, ErrBadInput, signer.cert.Subject.CommonName)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("cross-signing CA %q: %w", sub.Subject.CommonName, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		RawSubject:            sub.RawSubject,
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              sub.KeyUsage,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true, // it signs leaves only, as the CA it certifies
		SubjectKeyId:          sub.SubjectKeyId,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer.cert, sub.PublicKey, signer.key)
	if err != nil {
		return nil, fmt.Errorf("cross-signing CA %q: %w", sub.Subject.CommonName, err)
	}
	return EncodeCertPEM(der), nil
}

// crossOf is the certificate following the previous CA's in previousPEM (nil: none): it must be
// active cross-signed by previous (CrossSign); anything else is refused.
func crossOf(previousPEM []byte, active, previous *x509.Certificate) (*x509.Certificate, error) {
	var certs []*pem.Block
	for rest := previousPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == pemCertificate {
			certs = append(certs, b)
		}
	}
	switch len(certs) {
	case 0, 1:
		return nil, nil
	case 2:
	default:
		return nil, fmt.Errorf("%w: the previous CA's PEM holds %d certificates, at most 2 (it and the active CA cross-signed by it)", ErrBadInput, len(certs))
	}
	c, err := x509.ParseCertificate(certs[1].Bytes)
	if err != nil {
		return nil, fmt.Errorf("the cross-signed CA: %w: %w", ErrCertInvalid, err)
	}
	switch {
	case !c.IsCA || c.KeyUsage&x509.KeyUsageCertSign == 0:
		return nil, fmt.Errorf("the cross-signed CA %q: %w: not a CA certificate allowed to sign certificates", c.Subject.CommonName, ErrCertInvalid)
	case !bytes.Equal(c.RawSubject, active.RawSubject) || !bytes.Equal(c.RawSubjectPublicKeyInfo, active.RawSubjectPublicKeyInfo):
		return nil, fmt.Errorf("the cross-signed CA %q: %w: not the active CA", c.Subject.CommonName, ErrBadInput)
	case !bytes.Equal(c.RawIssuer, previous.RawSubject) || c.CheckSignatureFrom(previous) != nil:
		return nil, fmt.Errorf("the cross-signed CA %q: %w: not signed by the previous CA", c.Subject.CommonName, ErrUnknownCA)
	}
	return c, nil
}

// ParseCACertPEM parses one PEM CA certificate allowed to sign certificates.
func ParseCACertPEM(certPEM []byte) (*x509.Certificate, []byte, error) {
	der, err := DecodeCertPEM(certPEM)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrCertInvalid, err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, nil, fmt.Errorf("%q: %w: not a CA certificate allowed to sign certificates", cert.Subject.CommonName, ErrCertInvalid)
	}
	return cert, der, nil
}

// IssuerOf is the fingerprint of the trusted CA that issued certDER ("" when none of the CAs
// trusted now did, or it does not parse). Validity is not checked.
func (ca *CA) IssuerOf(certDER []byte) string {
	set := ca.current()
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return ""
	}
	if a := issuerIn(set, cert); a != nil {
		return a.fp
	}
	return ""
}

// BundleCerts parses the CERTIFICATE blocks of a PEM bundle (other blocks and text are skipped;
// blocks that do not parse are left out).
func BundleCerts(bundle []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for rest := bundle; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			return out
		}
		if blk.Type != pemCertificate {
			continue
		}
		if c, err := x509.ParseCertificate(blk.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

// BundleFingerprints is the fingerprint of each certificate of a PEM bundle, in its order. Pure.
func BundleFingerprints(bundle []byte) []string {
	var out []string
	for _, c := range BundleCerts(bundle) {
		out = append(out, Fingerprint(c.Raw))
	}
	return out
}

// IssuerInBundle is the fingerprint of the CA certificate of bundle that signed leaf ("" none).
// Pure: an agent uses it to tell whether its certificate is the active CA's.
func IssuerInBundle(leaf *x509.Certificate, bundle []byte) string {
	for _, c := range BundleCerts(bundle) {
		if c.IsCA && bytes.Equal(leaf.RawIssuer, c.RawSubject) && leaf.CheckSignatureFrom(c) == nil {
			return Fingerprint(c.Raw)
		}
	}
	return ""
}

// Bounds on a CA bundle an agent takes (CheckBundle): a rotation trusts two CAs at most at once
// (the active one and the next or previous one), a little over a kilobyte of PEM.
const (
	MaxBundleCAs   = 2
	MaxBundleBytes = 8 << 10
)

// CheckBundle checks a CA bundle an agent is given to trust from now on (a renewal's answer):
// one or two CA certificates, one of which issued leaf (the agent's own certificate), so that
// the agent never stores a bundle that would not let it prove who it is; and nothing else
// (no text, no other PEM block, no certificate that does not parse), as the ramdisk's bcd.ca
// takes it: the agent's CA file is what its site passes to the ramdisks it boots.
func CheckBundle(bundle []byte, leaf *x509.Certificate) error {
	if len(bundle) > MaxBundleBytes {
		return fmt.Errorf("%w: a CA bundle of %d bytes, at most %d", ErrCertInvalid, len(bundle), MaxBundleBytes)
	}
	n := 0
	for rest := bytes.TrimSpace(bundle); len(rest) > 0; rest = bytes.TrimSpace(rest) {
		if !bytes.HasPrefix(rest, []byte("-----BEGIN ")) {
			return fmt.Errorf("%w: data outside the certificates of the CA bundle", ErrCertInvalid)
		}
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return fmt.Errorf("%w: block %d of the CA bundle does not decode", ErrCertInvalid, n+1)
		}
		if b.Type != pemCertificate || len(b.Headers) > 0 {
			return fmt.Errorf("%w: block %d of the CA bundle is not a plain CERTIFICATE", ErrCertInvalid, n+1)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return fmt.Errorf("%w: certificate %d of the CA bundle does not parse: %w", ErrCertInvalid, n+1, err)
		}
		if !c.IsCA || c.KeyUsage&x509.KeyUsageCertSign == 0 {
			return fmt.Errorf("%w: %q in the CA bundle is not a CA certificate allowed to sign certificates", ErrCertInvalid, c.Subject.CommonName)
		}
		if n++; n > MaxBundleCAs {
			return fmt.Errorf("%w: the CA bundle holds more than %d certificates", ErrCertInvalid, MaxBundleCAs)
		}
	}
	if n == 0 {
		return fmt.Errorf("%w: the CA bundle holds no certificate", ErrCertInvalid)
	}
	if IssuerInBundle(leaf, bundle) == "" {
		return fmt.Errorf("%w: no CA of the bundle issued the certificate %q", ErrUnknownCA, leaf.Subject.CommonName)
	}
	return nil
}

// RetiredAtHeader is the PEM header that says when a retired CA was retired (RFC 3339).
const RetiredAtHeader = "Retired-At"

// RetiredPEM is the PEM of a CA certificate retired at at, as SetRetired reads it back.
func RetiredPEM(certPEM []byte, at time.Time) ([]byte, error) {
	b, _ := pem.Decode(bytes.TrimSpace(certPEM))
	if b == nil || b.Type != pemCertificate {
		return nil, fmt.Errorf("retiring a CA: %w: not a PEM certificate", ErrBadInput)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Headers: map[string]string{RetiredAtHeader: at.UTC().Format(time.RFC3339Nano)}, Bytes: b.Bytes}), nil
}

// SetRetired sets the CAs finished rotations retired (a PEM bundle of their certificates, each
// with the time it was retired, RetiredPEM; empty: none). They are trusted for nothing live
// (agents, joins, results as they arrive): an audit of a stored result (VerifyRecordedStatement)
// accepts a signer they certified, valid when the result arrived, if it arrived before the CA
// was retired, so wipe proofs made before a rotation still verify after it.
func (ca *CA) SetRetired(bundle []byte) error {
	var out []*authority
	for rest := bytes.TrimSpace(bundle); len(rest) > 0; rest = bytes.TrimSpace(rest) {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return fmt.Errorf("setting the retired CAs: %w: not a PEM bundle", ErrBadInput)
		}
		cert, der, err := ParseCACertPEM(pem.EncodeToMemory(&pem.Block{Type: b.Type, Bytes: b.Bytes}))
		if err != nil {
			return fmt.Errorf("setting the retired CAs: %w", err)
		}
		a := authorityOf(cert, der, nil)
		if v, ok := b.Headers[RetiredAtHeader]; ok {
			if a.retiredAt, err = time.Parse(time.RFC3339Nano, v); err != nil {
				return fmt.Errorf("setting the retired CAs: %w: %s %q", ErrBadInput, RetiredAtHeader, v)
			}
		}
		out = append(out, a)
	}
	ca.st.retired.Store(&out)
	return nil
}

// auditSet is what an audit accepts: the CAs trusted now and the retired ones.
func (ca *CA) auditSet() *caSet {
	s := *ca.current()
	if r := ca.st.retired.Load(); r != nil {
		s.audit = *r
	}
	return &s
}

// verifyAudit is Verify against the CAs an audit accepts (auditSet), refusing a certificate of a
// retired CA for a time after it was retired.
func (ca *CA) verifyAudit(certDER []byte, at time.Time) (*x509.Certificate, Identity, error) {
	cert, id, issuer, err := verifyWith(ca.auditSet(), certDER, nil, at)
	if err != nil {
		return nil, Identity{}, err
	}
	if !issuer.retiredAt.IsZero() && at.After(issuer.retiredAt) {
		return nil, Identity{}, fmt.Errorf("verifying certificate %q: %w: its CA was retired at %s, before the result arrived at %s",
			cert.Subject.CommonName, ErrUnknownCA, issuer.retiredAt.UTC().Format(time.RFC3339), at.UTC().Format(time.RFC3339))
	}
	return cert, id, nil
}

// AuditPEM is every CA an audit accepts, trusted now or retired (CertPEM, then the retired
// ones): what an auditor verifies exported results against.
func (ca *CA) AuditPEM() []byte {
	out := ca.CertPEM()
	for _, a := range ca.auditSet().audit {
		out = append(out, a.certPEM...)
	}
	return out
}
