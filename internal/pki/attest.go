package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"time"
)

// Statement is what a node (or, for bmc.rotate, a site agent) signs about a command's result.
// The control plane rebuilds it from the stored command row and checks the stored signature:
// a gateway relaying the result can neither forge nor alter it.
type Statement struct {
	CommandID    string
	NodeID       string
	Kind         string // command kind, e.g. "disk.wipe"
	Generation   uint64 // the node's identity generation the signer's certificate names
	ResultSHA256 [32]byte
}

// Bounds on a statement's free-text fields.
const (
	MaxCommandIDLength   = 256
	MaxCommandKindLength = 64
)

// signingDomain separates statement signatures from any other use of the same key.
const signingDomain = "bcd attested command result v1"

// SigningInput is the exact byte string a statement's signature covers:
//
//	u64be(len(domain)) domain
//	u64be(len(CommandID)) CommandID
//	u64be(len(NodeID)) NodeID
//	u64be(len(Kind)) Kind
//	u64be(Generation)
//	ResultSHA256 (32 bytes)
//
// Every variable-length field is length-prefixed, so two different statements never produce
// the same input. The format is fixed: changing it means a new domain string.
func SigningInput(st Statement) []byte {
	n := 8*5 + len(signingDomain) + len(st.CommandID) + len(st.NodeID) + len(st.Kind) + 32
	b := make([]byte, 0, n)
	for _, s := range []string{signingDomain, st.CommandID, st.NodeID, st.Kind} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.BigEndian.AppendUint64(b, st.Generation)
	return append(b, st.ResultSHA256[:]...)
}

// ResultDigest is the SHA-256 of a command's result exactly as stored and sent (the JSON bytes,
// not a re-encoding of them).
func ResultDigest(resultJSON []byte) [32]byte { return sha256.Sum256(resultJSON) }

// Validate checks the statement's fields are present and bounded.
func (st Statement) Validate() error {
	switch {
	case st.CommandID == "" || len(st.CommandID) > MaxCommandIDLength:
		return fmt.Errorf("%w: command ID must be 1 to %d bytes", ErrBadStatement, MaxCommandIDLength)
	case st.Kind == "" || len(st.Kind) > MaxCommandKindLength:
		return fmt.Errorf("%w: command kind must be 1 to %d bytes", ErrBadStatement, MaxCommandKindLength)
	}
	if err := ValidateID(st.NodeID); err != nil {
		return fmt.Errorf("%w: node ID: %w", ErrBadStatement, err)
	}
	return nil
}

// SignStatement signs st with an ECDSA P-256 key: an ASN.1 signature over SHA-256(SigningInput(st)).
func SignStatement(key crypto.Signer, st Statement) ([]byte, error) {
	if err := st.Validate(); err != nil {
		return nil, fmt.Errorf("signing result of command %s: %w", st.CommandID, err)
	}
	if key == nil {
		return nil, fmt.Errorf("signing result of command %s: %w: no key", st.CommandID, ErrBadInput)
	}
	if pub, ok := key.Public().(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		return nil, fmt.Errorf("signing result of command %s: %w: key is not ECDSA P-256", st.CommandID, ErrBadInput)
	}
	digest := sha256.Sum256(SigningInput(st))
	sig, err := key.Sign(rand.Reader, digest[:], crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("signing result of command %s: %w", st.CommandID, err)
	}
	return sig, nil
}

// VerifyStatement checks a node-attested result. It refuses, with the sentinel named:
// an incomplete statement (ErrBadStatement); a signer certificate not from ca (ErrUnknownCA),
// expired (ErrCertExpired) or otherwise invalid (ErrCertInvalid, ErrBadIdentity); a signature
// that does not verify (ErrBadSignature); a node-tenant signer (ErrTenantCannotAttest); any
// other non-node signer (ErrNotNodeIdentity); a signer of another node (ErrNodeMismatch); a
// statement whose generation is not the certificate's (ErrGenerationMismatch); a certificate
// whose generation is not currentGeneration, the node's generation now (ErrIdentityRevoked).
//
// now is the time the certificate must be valid at: the wall clock when a result arrives; when
// re-checking a stored result later, the time it was received (so an old, honest attestation
// does not fail only because the node's certificate has expired since).
func VerifyStatement(ca *CA, signerCertDER []byte, st Statement, sig []byte, currentGeneration uint64, now time.Time) error {
	return verifyNodeStatement(ca, ca.Verify, signerCertDER, st, sig, currentGeneration, now)
}

// VerifyRecordedStatement is VerifyStatement for an audit of a stored result: its signer may
// also be certified by a CA a finished rotation retired (CA.SetRetired), as long as the
// certificate was valid at the time the result was received (at) and the CA was retired after
// it. Live results are checked with VerifyStatement: a retired CA certifies nothing new.
func VerifyRecordedStatement(ca *CA, signerCertDER []byte, st Statement, sig []byte, currentGeneration uint64, at time.Time) error {
	return verifyNodeStatement(ca, ca.verifyAudit, signerCertDER, st, sig, currentGeneration, at)
}

// verifyNodeStatement is VerifyStatement with the signer's certificate checked by verify.
func verifyNodeStatement(ca *CA, verify certVerifier, signerCertDER []byte, st Statement, sig []byte, currentGeneration uint64, at time.Time) error {
	_, id, err := verifySigned(ca, verify, signerCertDER, st, sig, at)
	if err == nil {
		err = nodeStatementDecision(id, st, currentGeneration)
	}
	if err != nil {
		return fmt.Errorf("verifying attested %s result of command %s for node %s: %w", st.Kind, st.CommandID, st.NodeID, err)
	}
	return nil
}

// VerifySiteStatement checks a site-signed result (bmc.rotate): as VerifyStatement for the
// certificate and signature, then only a site agent (ErrNotSiteIdentity) of site siteID
// (ErrSiteMismatch) is accepted. The statement's generation is not interpreted.
func VerifySiteStatement(ca *CA, signerCertDER []byte, st Statement, sig []byte, siteID string, now time.Time) error {
	_, id, err := verifySigned(ca, ca.Verify, signerCertDER, st, sig, now)
	if err == nil {
		err = siteStatementDecision(id, siteID)
	}
	if err != nil {
		return fmt.Errorf("verifying site-signed %s result of command %s for node %s: %w", st.Kind, st.CommandID, st.NodeID, err)
	}
	return nil
}

// certVerifier checks a signer's certificate at a time: CA.Verify (the CAs trusted now) or
// CA.verifyAudit (those and the retired ones).
type certVerifier func(certDER []byte, at time.Time) (*x509.Certificate, Identity, error)

// verifySigned checks the statement's form, the signer's certificate (by verify) and the
// signature.
func verifySigned(ca *CA, verify certVerifier, certDER []byte, st Statement, sig []byte, at time.Time) (*x509.Certificate, Identity, error) {
	if ca == nil {
		return nil, Identity{}, fmt.Errorf("%w: no CA", ErrBadInput)
	}
	if err := st.Validate(); err != nil {
		return nil, Identity{}, err
	}
	cert, id, err := verify(certDER, at)
	if err != nil {
		return nil, Identity{}, err
	}
	return checkSignature(ca, cert, id, certDER, st, sig)
}

// checkSignature checks sig, by cert's key, over the statement.
func checkSignature(ca *CA, cert *x509.Certificate, id Identity, certDER []byte, st Statement, sig []byte) (*x509.Certificate, Identity, error) {
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, Identity{}, fmt.Errorf("%w: signer key is not ECDSA P-256", ErrBadSignature)
	}
	digest := sha256.Sum256(SigningInput(st))
	if !ca.verifySignature(certDER, pub, digest[:], sig) {
		return nil, Identity{}, fmt.Errorf("%w (signer %s)", ErrBadSignature, id)
	}
	return cert, id, nil
}

// nodeStatementDecision is the pure rule for who may attest a node's result.
func nodeStatementDecision(id Identity, st Statement, currentGeneration uint64) error {
	switch id.Kind {
	case KindNode:
	case KindNodeTenant:
		return fmt.Errorf("%w (signer %s)", ErrTenantCannotAttest, id)
	default:
		return fmt.Errorf("%w: signer is a %s (%s)", ErrNotNodeIdentity, id.Kind, id)
	}
	if id.NodeID != st.NodeID {
		return fmt.Errorf("%w: certificate names node %s", ErrNodeMismatch, id.NodeID)
	}
	if st.Generation != id.Generation {
		return fmt.Errorf("%w: statement generation %d, certificate generation %d", ErrGenerationMismatch, st.Generation, id.Generation)
	}
	if id.Generation != currentGeneration {
		return fmt.Errorf("%w: certificate generation %d, node's current generation %d", ErrIdentityRevoked, id.Generation, currentGeneration)
	}
	return nil
}

// siteStatementDecision is the pure rule for who may sign a site statement.
func siteStatementDecision(id Identity, siteID string) error {
	if id.Kind != KindSiteAgent {
		return fmt.Errorf("%w: signer is a %s (%s)", ErrNotSiteIdentity, id.Kind, id)
	}
	if id.SiteID != siteID {
		return fmt.Errorf("%w: signer belongs to site %s, want %s", ErrSiteMismatch, id.SiteID, siteID)
	}
	return nil
}
