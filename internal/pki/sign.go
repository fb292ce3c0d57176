package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
)

// Go's x509.CreateCertificate and CreateCertificateRequest check every signature they are
// handed by verifying it: a guard against a faulty signer (a hardware module), and an ECDSA
// verification costs about three signatures. Every join signs two (the agent's request, the
// CA's certificate): the guard was 7 % of the CPU of a simulated fleet's lifecycle.
// signedBy keeps x509's encoding and drops the guard for keys in this process: x509 builds the
// part to be signed and hands it to tbsSigner, which signs it with the key and stops x509
// there (errTBSSigned); signedBy then wraps the part and its signature as x509 would.

// oidECDSAWithSHA256 names the only signature signedBy makes (P-256 keys, SHA-256).
var oidECDSAWithSHA256 = asn1.ObjectIdentifier{1, 2, 840, 10045, 4, 3, 2}

// errTBSSigned stops x509 once tbsSigner has the part to be signed and its signature.
var errTBSSigned = errors.New("pki: to-be-signed part taken")

// tbsSigner is a crypto.MessageSigner over an ECDSA P-256 key that keeps what x509 asked it to
// sign and the signature, and answers errTBSSigned.
type tbsSigner struct {
	key      *ecdsa.PrivateKey
	tbs, sig []byte
}

func (s *tbsSigner) Public() crypto.PublicKey { return s.key.Public() }

// Sign signs a digest as the key would (an x509 that no longer hands over the message: its own
// check then runs as before).
func (s *tbsSigner) Sign(r io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.key.Sign(r, digest, opts)
}

func (s *tbsSigner) SignMessage(r io.Reader, msg []byte, opts crypto.SignerOpts) ([]byte, error) {
	if opts.HashFunc() != crypto.SHA256 {
		return nil, fmt.Errorf("signing: hash %v, only SHA-256 is signed here", opts.HashFunc())
	}
	digest := sha256.Sum256(msg)
	sig, err := ecdsa.SignASN1(r, s.key, digest[:])
	if err != nil {
		return nil, err
	}
	s.tbs, s.sig = append([]byte(nil), msg...), sig
	return nil, errTBSSigned
}

// signedDER is a signed X.509 structure: a certificate and a certificate request have this
// same outer form (RFC 5280 §4.1, RFC 2986 §4.2).
type signedDER struct {
	TBS       asn1.RawValue
	Algorithm pkix.AlgorithmIdentifier
	Signature asn1.BitString
}

// signedBy returns what create (an x509.CreateCertificate or CreateCertificateRequest with the
// signer it is given) makes when it signs with key, an ECDSA P-256 key, without x509's check of
// its own signature (see above).
func signedBy(key *ecdsa.PrivateKey, create func(crypto.Signer) ([]byte, error)) ([]byte, error) {
	if key == nil || key.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: signing key is not ECDSA P-256", ErrBadInput)
	}
	s := &tbsSigner{key: key}
	der, err := create(s)
	switch {
	case err == nil:
		return der, nil // (signed through Sign, and checked by x509)
	case !errors.Is(err, errTBSSigned) || s.tbs == nil:
		return nil, err
	}
	var tbs asn1.RawValue
	if rest, err := asn1.Unmarshal(s.tbs, &tbs); err != nil || len(rest) > 0 || tbs.Tag != asn1.TagSequence {
		return nil, fmt.Errorf("signing: x509 handed over %d bytes that are not one DER sequence", len(s.tbs))
	}
	return asn1.Marshal(signedDER{
		TBS:       asn1.RawValue{FullBytes: s.tbs},
		Algorithm: pkix.AlgorithmIdentifier{Algorithm: oidECDSAWithSHA256},
		Signature: asn1.BitString{Bytes: s.sig, BitLength: 8 * len(s.sig)},
	})
}

// newCSR makes a certificate request naming commonName, signed by key.
func newCSR(key *ecdsa.PrivateKey, commonName string) ([]byte, error) {
	return signedBy(key, func(s crypto.Signer) ([]byte, error) {
		return x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: commonName}}, s)
	})
}
