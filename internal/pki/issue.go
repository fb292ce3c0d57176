package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"strings"
	"time"
)

// IssueSiteAgent signs a client certificate naming site agent agentID of site siteID for the key
// in csrDER. Only the CSR's key is used: its subject and extensions are ignored, the CA alone
// decides what the certificate says.
func (ca *CA) IssueSiteAgent(csrDER []byte, siteID, agentID string, ttl time.Duration, now time.Time) ([]byte, error) {
	return ca.issueFromCSR(csrDER, SiteAgentIdentity(siteID, agentID), ttl, now)
}

// IssueNode signs the platform identity of node nodeID at identity generation generation.
// Only this kind of certificate can attest results.
func (ca *CA) IssueNode(csrDER []byte, nodeID string, generation uint64, ttl time.Duration, now time.Time) ([]byte, error) {
	return ca.issueFromCSR(csrDER, NodeIdentity(nodeID, generation), ttl, now)
}

// IssueNodeTenant signs a lessee's certificate for node nodeID: it authenticates tenantID's
// agent on that node, and can never attest.
func (ca *CA) IssueNodeTenant(csrDER []byte, nodeID, tenantID string, generation uint64, ttl time.Duration, now time.Time) ([]byte, error) {
	return ca.issueFromCSR(csrDER, NodeTenantIdentity(nodeID, tenantID, generation), ttl, now)
}

func (ca *CA) issueFromCSR(csrDER []byte, id Identity, ttl time.Duration, now time.Time) ([]byte, error) {
	pub, err := checkCSR(csrDER)
	if err != nil {
		return nil, fmt.Errorf("issuing %s certificate: %w", id.Kind, err)
	}
	der, err := ca.issue(pub, id, nil, nil, ttl, now)
	if err != nil {
		return nil, fmt.Errorf("issuing %s certificate: %w", id.Kind, err)
	}
	return der, nil
}

// IssueServer makes a key and a TLS server certificate for the control plane, valid for hosts
// (DNS names and IP addresses). The key is returned PEM encoded for the caller to store.
func (ca *CA) IssueServer(hosts []string, ttl time.Duration, now time.Time) (certPEM, keyPEM []byte, err error) {
	dnsNames, ips, err := splitHosts(hosts)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing server certificate: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing server certificate: generating key: %w", err)
	}
	der, err := ca.issue(&key.PublicKey, ServerIdentity(), dnsNames, ips, ttl, now)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing server certificate: %w", err)
	}
	keyPEM, err = EncodeKeyPEM(key)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing server certificate: %w", err)
	}
	return EncodeCertPEM(der), keyPEM, nil
}

// checkCSR parses a PKCS#10 request, verifies its self-signature and returns its P-256 key.
func checkCSR(csrDER []byte) (*ecdsa.PublicKey, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: signature: %w", ErrBadCSR, err)
	}
	pub, ok := csr.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: key is %T, want ECDSA P-256", ErrBadCSR, csr.PublicKey)
	}
	return pub, nil
}

// splitHosts validates server hosts: IP addresses or DNS names (no wildcards).
func splitHosts(hosts []string) (dnsNames []string, ips []net.IP, err error) {
	if len(hosts) == 0 {
		return nil, nil, fmt.Errorf("%w: no hosts", ErrBadInput)
	}
	if len(hosts) > 100 {
		return nil, nil, fmt.Errorf("%w: %d hosts, at most 100", ErrBadInput, len(hosts))
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			ips = append(ips, ip)
			continue
		}
		if err := validateDNSName(h); err != nil {
			return nil, nil, fmt.Errorf("%w: host %q: %w", ErrBadInput, truncate(h), err)
		}
		dnsNames = append(dnsNames, strings.ToLower(h))
	}
	return dnsNames, ips, nil
}

func validateDNSName(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("DNS name must be 1 to 253 bytes")
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("DNS label %q must be 1 to 63 bytes", label)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("DNS label %q starts or ends with '-'", label)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("DNS label %q has character %q", label, c)
			}
		}
	}
	return nil
}

// NewKeyAndCSR is the agent side of joining: it makes a P-256 key (kept in RAM by the caller)
// and a PKCS#10 request for it. The common name is informative only.
func NewKeyAndCSR(commonName string) (crypto.Signer, []byte, error) {
	if len(commonName) > 64 {
		return nil, nil, fmt.Errorf("making certificate request: %w: common name longer than 64 bytes", ErrBadInput)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("making certificate request: generating key: %w", err)
	}
	csr, err := newCSR(key, commonName)
	if err != nil {
		return nil, nil, fmt.Errorf("making certificate request: %w", err)
	}
	return key, csr, nil
}

// PEM block types.
const (
	pemCertificate = "CERTIFICATE"
	pemCSR         = "CERTIFICATE REQUEST"
	pemPrivateKey  = "PRIVATE KEY"
	pemECKey       = "EC PRIVATE KEY"
)

// EncodeCertPEM, EncodeCSRPEM wrap DER bytes in PEM.
func EncodeCertPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der})
}

func EncodeCSRPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: pemCSR, Bytes: der})
}

// DecodeCertPEM returns the DER bytes of the first CERTIFICATE block.
func DecodeCertPEM(data []byte) ([]byte, error) { return decodePEM(data, pemCertificate) }

// DecodeCSRPEM returns the DER bytes of the first CERTIFICATE REQUEST block.
func DecodeCSRPEM(data []byte) ([]byte, error) { return decodePEM(data, pemCSR) }

func decodePEM(data []byte, typ string) ([]byte, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, fmt.Errorf("%w: no PEM %s block", ErrBadInput, typ)
		}
		if b.Type == typ {
			return b.Bytes, nil
		}
	}
}

// EncodeKeyPEM encodes a private key as PKCS#8 PEM.
func EncodeKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemPrivateKey, Bytes: der}), nil
}

// ParseKeyPEM decodes a PKCS#8 ("PRIVATE KEY") or SEC 1 ("EC PRIVATE KEY") PEM private key.
// Errors never include the key's bytes.
func ParseKeyPEM(data []byte) (crypto.Signer, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, fmt.Errorf("%w: no PEM private key block", ErrBadInput)
		}
		switch b.Type {
		case pemPrivateKey:
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%w: parsing PKCS#8 private key", ErrBadInput)
			}
			s, ok := k.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("%w: private key of type %T cannot sign", ErrBadInput, k)
			}
			return s, nil
		case pemECKey:
			k, err := x509.ParseECPrivateKey(b.Bytes)
			if err != nil {
				return nil, fmt.Errorf("%w: parsing EC private key", ErrBadInput)
			}
			return k, nil
		}
	}
}
