package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"fmt"

	jose "github.com/go-jose/go-jose/v4"
)

// MaxJWELength bounds a compact JWE accepted by DecryptAsAgent.
const MaxJWELength = 64 << 10

// EncryptToAgent encrypts plaintext (a BMC password, …) to the key of an agent's certificate as
// a compact JWE (ECDH-ES+A256KW, A256GCM). Only site-agent and platform node certificates
// with an ECDSA P-256 key may receive secrets; a node-tenant or server certificate may not
// (ErrNotRecipient). The caller passes a certificate it verified (its store's copy); errors
// never contain the plaintext.
func EncryptToAgent(agentCertDER []byte, plaintext []byte) (string, error) {
	cert, err := x509.ParseCertificate(agentCertDER)
	if err != nil {
		return "", fmt.Errorf("encrypting to agent: %w: %w", ErrCertInvalid, err)
	}
	id, err := ParseIdentity(cert)
	if err != nil {
		return "", fmt.Errorf("encrypting to agent: %w", err)
	}
	spec, _ := specOf(id.Kind)
	if !spec.keyAgreement || cert.KeyUsage&x509.KeyUsageKeyAgreement == 0 {
		return "", fmt.Errorf("encrypting to %s: %w: a %s certificate cannot receive secrets", id, ErrNotRecipient, id.Kind)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return "", fmt.Errorf("encrypting to %s: %w: key is not ECDSA P-256", id, ErrNotRecipient)
	}
	enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{
		Algorithm: jose.ECDH_ES_A256KW,
		Key:       pub,
		KeyID:     Fingerprint(cert.Raw),
	}, nil)
	if err != nil {
		return "", fmt.Errorf("encrypting to %s: %w", id, err)
	}
	obj, err := enc.Encrypt(plaintext)
	if err != nil {
		return "", fmt.Errorf("encrypting to %s: %w", id, err)
	}
	compact, err := obj.CompactSerialize()
	if err != nil {
		return "", fmt.Errorf("encrypting to %s: serializing: %w", id, err)
	}
	return compact, nil
}

// DecryptAsAgent decrypts a compact JWE made by EncryptToAgent with the agent's private key
// (an *ecdsa.PrivateKey, as NewKeyAndCSR returns). Only ECDH-ES+A256KW with A256GCM is
// accepted. A tampered or misaddressed JWE fails with ErrDecrypt.
func DecryptAsAgent(key crypto.PrivateKey, compact string) ([]byte, error) {
	k, ok := key.(*ecdsa.PrivateKey)
	if !ok || k.Curve != elliptic.P256() {
		return nil, fmt.Errorf("decrypting secret: %w: key is %T, want an ECDSA P-256 private key", ErrBadInput, key)
	}
	if len(compact) > MaxJWELength {
		return nil, fmt.Errorf("decrypting secret: %w: JWE of %d bytes is longer than %d", ErrDecrypt, len(compact), MaxJWELength)
	}
	obj, err := jose.ParseEncryptedCompact(compact, []jose.KeyAlgorithm{jose.ECDH_ES_A256KW}, []jose.ContentEncryption{jose.A256GCM})
	if err != nil {
		return nil, fmt.Errorf("decrypting secret: %w: parsing JWE: %w", ErrDecrypt, err)
	}
	plain, err := obj.Decrypt(k)
	if err != nil {
		return nil, fmt.Errorf("decrypting secret: %w: %w", ErrDecrypt, err)
	}
	return plain, nil
}
