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
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"bcd/internal/cache"
)

const (
	// CAValidity is how long a CA made by CreateCA is valid.
	CAValidity = 10 * 365 * 24 * time.Hour
	// MaxLeafTTL bounds the lifetime of every certificate the CA issues.
	MaxLeafTTL = 2 * 365 * 24 * time.Hour
	// ClockSkew is how far back a certificate's NotBefore is set, so that a peer whose clock is
	// a little behind accepts it at once.
	ClockSkew = 5 * time.Minute

	// CACertFile and CAKeyFile are the file names LoadCADir reads.
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// CA is the control plane's certificate authority: the installation's agent CA. It holds one
// signer (the active CA) and, during a rotation (SetRotation), a second CA that it trusts too:
// the next one, staged and handed out to agents before it signs anything, or the previous one,
// the retired signer, trusted until the rotation finishes. Private keys never leave it: String,
// GoString and LogValue show the active CA's subject and fingerprint only.
type CA struct{ st *caState }

type caState struct {
	set atomic.Pointer[caSet]
	// certs keeps certificates Verify accepted (by the SHA-256 of their DER) with the CA that
	// issued them: the parse, signature and chain checks do not depend on the time, only the
	// validity windows do, and those are checked again at every call, as is the issuer still
	// being trusted. A node's certificate signs several results.
	certs *cache.Bounded[[32]byte, verifiedCert]
	// sigs keeps signatures that verified, by the SHA-256 of (certificate, digest, signature):
	// a result is checked when its report arrives and again when the engine takes it.
	sigs *cache.Verified
	// issued keeps the certificates this CA signed (by the SHA-256 of their DER) with the
	// fingerprint of the CA that signed them: Verify takes one of them without checking its
	// signature and chain, which this process made (a node's certificate meets Verify first
	// when its first attested result arrives, minutes after its join). Its validity windows
	// and its issuer being trusted are checked at every call, as for certs.
	issued *cache.Bounded[[32]byte, string]
	// retired are the CAs finished rotations retired (SetRetired): trusted for nothing live,
	// only for audits of what they certified (VerifyRecordedStatement).
	retired atomic.Pointer[[]*authority]
}

// authority is one CA certificate and, for a CA that signs or will, its key.
type authority struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey // nil for the previous CA: trusted, never signing again
	fp      string
	// retiredAt is when a finished rotation retired it (retired CAs only; zero: not known):
	// an audit accepts what it certified for results that arrived before.
	retiredAt time.Time
}

// caSet is what a CA trusts and signs with at one time; replaced whole (SetRotation).
type caSet struct {
	active, next, previous *authority
	// audit are further CAs an audit accepts (retired ones); in audit sets only (auditSet).
	audit []*authority
	// cross is the active CA cross-signed by the previous one (overlap only; nil: none): sent
	// after the gateway's certificate, trusted for nothing here.
	cross  *x509.Certificate
	bundle []byte         // every trusted CA's PEM, the active one first
	pool   *x509.CertPool // every trusted CA; shared, never added to
	fps    []string       // every trusted CA's fingerprint, the active one first
}

// trusted lists the trusted CAs, the active one first.
func (s *caSet) trusted() []*authority {
	out := []*authority{s.active}
	for _, a := range []*authority{s.next, s.previous} {
		if a != nil {
			out = append(out, a)
		}
	}
	return append(out, s.audit...)
}

// byFingerprint is the trusted CA of fingerprint fp (nil: none).
func (s *caSet) byFingerprint(fp string) *authority {
	for _, a := range s.trusted() {
		if a.fp == fp {
			return a
		}
	}
	return nil
}

func newSet(active, next, previous *authority) *caSet {
	s := &caSet{active: active, next: next, previous: previous, pool: x509.NewCertPool()}
	for _, a := range s.trusted() {
		s.bundle = append(s.bundle, a.certPEM...)
		s.pool.AddCert(a.cert)
		s.fps = append(s.fps, a.fp)
	}
	return s
}

type verifiedCert struct {
	cert   *x509.Certificate
	id     Identity
	issuer string // fingerprint of the CA that issued it
}

// maxVerified bounds the verified certificates kept (emptied when full).
const maxVerified = 4096

// maxVerifiedSignatures bounds the verified signatures kept (emptied when full). An attested
// result's signature is checked before its report enters the writer (the engine's preverify)
// and again in the writer, from the stored row, where it must be found: emptied every 4 096
// checks, as the certificates' cache is, it lost the signatures of the reports waiting for the
// writer at each emptying, and the writer verified them again (0.28 s of its CPU at 10 000
// nodes). An entry is a hash, about 100 bytes with the map's own.
const maxVerifiedSignatures = 1 << 15

// maxIssued bounds the issued certificates remembered (a few per machine in a workflow: its
// ramdisk's and its OS's; emptied when full, which only costs the next Verify of each its
// checks). An entry is its hash and the issuer's fingerprint, about 100 bytes.
const maxIssued = 1 << 16

func authorityOf(cert *x509.Certificate, der []byte, key *ecdsa.PrivateKey) *authority {
	return &authority{cert: cert, certPEM: EncodeCertPEM(der), key: key, fp: Fingerprint(der)}
}

func caOf(cert *x509.Certificate, der []byte, key *ecdsa.PrivateKey) *CA {
	ca := &CA{st: &caState{certs: cache.New[[32]byte, verifiedCert](maxVerified), sigs: cache.NewVerified(maxVerifiedSignatures),
		issued: cache.New[[32]byte, string](maxIssued)}}
	ca.st.set.Store(newSet(authorityOf(cert, der, key), nil, nil))
	return ca
}

// current is the set in force now.
func (ca *CA) current() *caSet { return ca.st.set.Load() }

// signer is the active CA.
func (ca *CA) signer() *authority { return ca.current().active }

// CreateCA makes a new self-signed CA valid from now (minus ClockSkew) for CAValidity.
func CreateCA(commonName string, now time.Time) (*CA, error) {
	if commonName == "" || len(commonName) > 64 {
		return nil, fmt.Errorf("creating CA: %w: common name must be 1 to 64 bytes", ErrBadInput)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("creating CA %q: generating key: %w", commonName, err)
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, fmt.Errorf("creating CA %q: %w", commonName, err)
	}
	ski, err := subjectKeyID(&key.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("creating CA %q: %w", commonName, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName, Organization: []string{"bcd"}},
		NotBefore:             now.Add(-ClockSkew),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true, // the CA signs leaves only
		SubjectKeyId:          ski,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating CA %q: signing certificate: %w", commonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("creating CA %q: parsing own certificate: %w", commonName, err)
	}
	return caOf(cert, der, key), nil
}

// LoadCA loads a CA from its PEM certificate and PEM private key (PKCS#8 or SEC 1). The key
// must be ECDSA P-256 and match the certificate, which must be a CA allowed to sign certificates.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	der, err := DecodeCertPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("loading CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("loading CA certificate: %w: %w", ErrCertInvalid, err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("loading CA %q: %w: not a CA certificate allowed to sign certificates", cert.Subject.CommonName, ErrCertInvalid)
	}
	signer, err := ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("loading CA %q key: %w", cert.Subject.CommonName, err)
	}
	key, ok := signer.(*ecdsa.PrivateKey)
	if !ok || key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("loading CA %q key: %w: not an ECDSA P-256 key", cert.Subject.CommonName, ErrBadInput)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("loading CA %q: %w: private key does not match the certificate", cert.Subject.CommonName, ErrBadInput)
	}
	return caOf(cert, der, key), nil
}

// LoadCADir loads the CA kept in dir as ca.crt and ca.key (how a server kept its CA before the
// CA moved into the store); found is false when neither file exists. It refuses a directory
// holding only one of the two files, and a key file readable by group or others.
func LoadCADir(dir string) (ca *CA, found bool, err error) {
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	certOK, err := exists(certPath)
	if err != nil {
		return nil, false, fmt.Errorf("loading CA from %s: %w", dir, err)
	}
	keyOK, err := exists(keyPath)
	if err != nil {
		return nil, false, fmt.Errorf("loading CA from %s: %w", dir, err)
	}
	switch {
	case !certOK && !keyOK:
		return nil, false, nil
	case certOK != keyOK:
		return nil, false, fmt.Errorf("loading CA from %s: %w: found only one of %s and %s; restore the other or remove both",
			dir, ErrBadInput, CACertFile, CAKeyFile)
	}
	st, err := os.Stat(keyPath)
	if err != nil {
		return nil, false, fmt.Errorf("loading CA from %s: %w", dir, err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, false, fmt.Errorf("loading CA from %s: %w: %s has mode %04o, want 0600 (chmod 600 %s)", dir, ErrBadInput, keyPath, st.Mode().Perm(), keyPath)
	}
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, false, fmt.Errorf("loading CA from %s: %w", dir, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, false, fmt.Errorf("loading CA from %s: %w", dir, err)
	}
	ca, err = LoadCA(certPEM, keyPEM)
	if err != nil {
		return nil, false, fmt.Errorf("loading CA from %s: %w", dir, err)
	}
	return ca, true, nil
}

func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, err
	}
}

// CertPEM returns every CA certificate trusted now, PEM encoded, the active one first: what
// agents are given to trust (one certificate outside a rotation, two during one).
func (ca *CA) CertPEM() []byte { return bytes.Clone(ca.current().bundle) }

// Certificate returns the parsed certificate of the active CA (the one that signs).
func (ca *CA) Certificate() *x509.Certificate { return ca.signer().cert }

// KeyPEM returns the active CA's private key, PKCS#8 PEM encoded, for the caller to store (0600).
func (ca *CA) KeyPEM() ([]byte, error) { return EncodeKeyPEM(ca.signer().key) }

// Pool returns a new pool holding every CA trusted now (a fresh one each call: callers may add
// to it).
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	for _, a := range ca.current().trusted() {
		p.AddCert(a.cert)
	}
	return p
}

// Fingerprint is the SHA-256 of the active CA's certificate, hex encoded.
func (ca CA) Fingerprint() string { return ca.signer().fp }

// String shows the active CA's subject and fingerprint, never a key. Value receivers: a CA
// value printed by mistake (fmt.Print(*ca)) shows the same.
func (ca CA) String() string {
	return fmt.Sprintf("CA %q sha256:%s", ca.signer().cert.Subject.CommonName, ca.Fingerprint())
}

// GoString keeps %#v from printing the key.
func (ca CA) GoString() string { return ca.String() }

// LogValue keeps slog from printing the key.
func (ca CA) LogValue() slog.Value {
	return slog.GroupValue(slog.String("subject", ca.signer().cert.Subject.CommonName), slog.String("sha256", ca.Fingerprint()))
}

// Fingerprint is the SHA-256 of DER bytes (a certificate), hex encoded.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// Verify checks that certDER was issued by a CA trusted now (the active one, or during a
// rotation the next or previous one), is valid at now, and carries a well-formed identity.
// Errors wrap ErrCertInvalid, ErrUnknownCA, ErrCertExpired or ErrBadIdentity.
func (ca *CA) Verify(certDER []byte, now time.Time) (*x509.Certificate, Identity, error) {
	return ca.verify(certDER, nil, now)
}

// VerifyCert is Verify for a certificate already parsed, a TLS connection's peer's: the same
// checks, and what is kept for later calls is cert itself rather than a second parse of it
// (3.4 KiB for every agent connected, beside the connection's own).
func (ca *CA) VerifyCert(cert *x509.Certificate, now time.Time) (*x509.Certificate, Identity, error) {
	if cert == nil {
		return nil, Identity{}, fmt.Errorf("verifying certificate: %w: none", ErrCertInvalid)
	}
	return ca.verify(cert.Raw, cert, now)
}

// verify is Verify of certDER, parsed already as parsed when that is not nil.
func (ca *CA) verify(certDER []byte, parsed *x509.Certificate, now time.Time) (*x509.Certificate, Identity, error) {
	key := sha256.Sum256(certDER)
	set := ca.current()
	v, ok := ca.st.certs.Get(key)
	valid := func(c *x509.Certificate) bool { return !now.Before(c.NotBefore) && !now.After(c.NotAfter) }
	if ok {
		if a := set.byFingerprint(v.issuer); a != nil && valid(v.cert) && valid(a.cert) {
			return v.cert, v.id, nil
		}
	}
	if v, ok := ca.issuedCert(set, key, certDER, parsed, valid); ok {
		ca.st.certs.Put(key, v)
		return v.cert, v.id, nil
	}
	cert, id, issuer, err := verifyWith(set, certDER, parsed, now)
	if err != nil {
		return nil, Identity{}, err
	}
	ca.st.certs.Put(key, verifiedCert{cert: cert, id: id, issuer: issuer.fp})
	return cert, id, nil
}

// parsedOr is certDER parsed: parsed when that is not nil.
func parsedOr(certDER []byte, parsed *x509.Certificate) (*x509.Certificate, error) {
	if parsed != nil {
		return parsed, nil
	}
	return x509.ParseCertificate(certDER)
}

// issuedCert is certDER (of SHA-256 key) as this CA issued it (caState.issued), parsed (parsed
// when not nil), if its issuer is still trusted and both are valid now; false otherwise (the
// full checks then say why).
func (ca *CA) issuedCert(set *caSet, key [32]byte, certDER []byte, parsed *x509.Certificate, valid func(*x509.Certificate) bool) (verifiedCert, bool) {
	fp, ok := ca.st.issued.Get(key)
	if !ok {
		return verifiedCert{}, false
	}
	if a := set.byFingerprint(fp); a == nil || !valid(a.cert) {
		return verifiedCert{}, false
	}
	cert, err := parsedOr(certDER, parsed)
	if err != nil || !valid(cert) {
		return verifiedCert{}, false
	}
	id, err := ParseIdentity(cert)
	if err != nil {
		return verifiedCert{}, false
	}
	return verifiedCert{cert: cert, id: id, issuer: fp}, true
}

// verifySignature reports whether sig is the signature of digest by pub, the key of certDER's
// certificate; a signature once verified is remembered (by all three inputs).
func (ca *CA) verifySignature(certDER []byte, pub *ecdsa.PublicKey, digest, sig []byte) bool {
	return ca.st.sigs.Check(func() bool { return ecdsa.VerifyASN1(pub, digest, sig) }, certDER, digest, sig)
}

// issuerIn is the CA of set that signed cert (nil: none).
func issuerIn(set *caSet, cert *x509.Certificate) *authority {
	for _, a := range set.trusted() {
		if bytes.Equal(cert.RawIssuer, a.cert.RawSubject) && cert.CheckSignatureFrom(a.cert) == nil {
			return a
		}
	}
	return nil
}

func verifyWith(set *caSet, certDER []byte, parsed *x509.Certificate, now time.Time) (*x509.Certificate, Identity, *authority, error) {
	cert, err := parsedOr(certDER, parsed)
	if err != nil {
		return nil, Identity{}, nil, fmt.Errorf("verifying certificate: %w: %w", ErrCertInvalid, err)
	}
	name := cert.Subject.CommonName
	issuer := issuerIn(set, cert)
	if issuer == nil {
		return nil, Identity{}, nil, fmt.Errorf("verifying certificate %q: %w (issuer %q)", name, ErrUnknownCA, cert.Issuer.CommonName)
	}
	if now.Before(cert.NotBefore) || now.After(cert.NotAfter) {
		return nil, Identity{}, nil, fmt.Errorf("verifying certificate %q: %w: valid from %s to %s, checked at %s",
			name, ErrCertExpired, cert.NotBefore.UTC().Format(time.RFC3339), cert.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	roots := x509.NewCertPool()
	roots.AddCert(issuer.cert)
	_, err = cert.Verify(x509.VerifyOptions{
		Roots:       roots,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		var inv x509.CertificateInvalidError
		var unk x509.UnknownAuthorityError
		switch {
		case errors.As(err, &inv) && inv.Reason == x509.Expired:
			return nil, Identity{}, nil, fmt.Errorf("verifying certificate %q: %w: %w", name, ErrCertExpired, err)
		case errors.As(err, &unk):
			return nil, Identity{}, nil, fmt.Errorf("verifying certificate %q: %w: %w", name, ErrUnknownCA, err)
		default:
			return nil, Identity{}, nil, fmt.Errorf("verifying certificate %q: %w: %w", name, ErrCertInvalid, err)
		}
	}
	id, err := ParseIdentity(cert)
	if err != nil {
		return nil, Identity{}, nil, fmt.Errorf("verifying certificate %q: %w", name, err)
	}
	return cert, id, issuer, nil
}

// issue signs a leaf certificate for pub naming id (and, for servers, hosts).
func (ca *CA) issue(pub *ecdsa.PublicKey, id Identity, dnsNames []string, ips []net.IP, ttl time.Duration, now time.Time) ([]byte, error) {
	signer := ca.signer()
	if err := id.Validate(); err != nil {
		return nil, err
	}
	spec, _ := specOf(id.Kind) // Validate checked the kind
	if ttl <= 0 || ttl > MaxLeafTTL {
		return nil, fmt.Errorf("%w: ttl %s must be positive and at most %s", ErrBadInput, ttl, MaxLeafTTL)
	}
	notAfter := now.Add(ttl)
	if notAfter.After(signer.cert.NotAfter) {
		return nil, fmt.Errorf("%w: certificate would outlive the CA (CA expires %s)", ErrBadInput, signer.cert.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(signer.cert.NotBefore) {
		return nil, fmt.Errorf("%w: CA is not valid yet at %s", ErrBadInput, now.UTC().Format(time.RFC3339))
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	ski, err := subjectKeyID(pub)
	if err != nil {
		return nil, err
	}
	uri, err := parseURL(id.URI())
	if err != nil {
		return nil, err
	}
	usage := x509.KeyUsageDigitalSignature
	if spec.keyAgreement {
		usage |= x509.KeyUsageKeyAgreement
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName(id), Organization: []string{"bcd"}},
		NotBefore:             now.Add(-ClockSkew),
		NotAfter:              notAfter,
		KeyUsage:              usage,
		ExtKeyUsage:           []x509.ExtKeyUsage{spec.extKeyUsage},
		BasicConstraintsValid: true,
		IsCA:                  false,
		SubjectKeyId:          ski,
		URIs:                  []*url.URL{uri},
		DNSNames:              dnsNames,
		IPAddresses:           ips,
	}
	der, err := signedBy(signer.key, func(s crypto.Signer) ([]byte, error) {
		return x509.CreateCertificate(rand.Reader, tmpl, signer.cert, pub, s)
	})
	if err != nil {
		return nil, fmt.Errorf("signing %s certificate: %w", id.Kind, err)
	}
	ca.st.issued.Put(sha256.Sum256(der), signer.fp)
	return der, nil
}

// commonName is informative only (identities are read from the URI SAN); at most 64 bytes.
func commonName(id Identity) string {
	var cn string
	switch id.Kind {
	case KindSiteAgent:
		cn = "site-agent " + id.SiteID + "/" + id.AgentID
	case KindNode:
		cn = "node " + id.NodeID
	case KindNodeTenant:
		cn = "node-tenant " + id.NodeID + "/" + id.TenantID
	default:
		cn = "bcd " + id.Kind.String()
	}
	if len(cn) > 64 {
		cn = cn[:64]
	}
	return cn
}

func randomSerial() (*big.Int, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	b[0] &= 0x7f // positive
	b[0] |= 0x40 // and always 16 bytes long
	return new(big.Int).SetBytes(b), nil
}

func subjectKeyID(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("marshalling public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return sum[:20], nil
}

func parseURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w: identity URI %q: %w", ErrBadIdentity, s, err)
	}
	return u, nil
}
