package pki

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
)

// ServerTLSConfig is the control plane's TLS 1.3 configuration. A client certificate is
// verified against ca when the client presents one, and is optional: the join endpoints are
// reached without one. Handlers read the verified identity with IdentityFromTLS and refuse
// what that identity may not do.
func ServerTLSConfig(ca *CA, certPEM, keyPEM []byte) (*tls.Config, error) {
	if ca == nil {
		return nil, fmt.Errorf("building server TLS config: %w: no CA", ErrBadInput)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// tls errors name the failure, not the key bytes.
		return nil, fmt.Errorf("building server TLS config: loading key pair: %w", err)
	}
	cfg := serverTLS(ca)
	cfg.Certificates = []tls.Certificate{pair}
	return cfg, nil
}

// serverTLS is ServerTLSConfig without its certificate.
func serverTLS(ca *CA) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.VerifyClientCertIfGiven,
		ClientCAs:  ca.Pool(),
	}
}

// ClientTLSConfig is an agent's TLS 1.3 configuration: it trusts only the CA in caPEM and
// accepts only a server certificate carrying the bcd server identity. cert is the agent's
// certificate; pass the zero tls.Certificate before joining (no client certificate is sent).
// If caPEM holds no certificate every handshake fails: the configuration fails closed.
// The server's certificate chains to a CA of caPEM directly or, during a rotation's overlap
// for an agent that holds only the previous CA, through the new CA cross-signed by it
// (anchor). The caller sets ServerName when dialing.
func ClientTLSConfig(caPEM []byte, cert tls.Certificate) *tls.Config {
	pool := x509.NewCertPool()
	for _, c := range BundleCerts(caPEM) {
		pool.AddCert(anchor(c))
	}
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		RootCAs:    pool,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
				return errors.New("server certificate not verified")
			}
			id, err := ParseIdentity(cs.VerifiedChains[0][0])
			if err != nil {
				return fmt.Errorf("checking server identity: %w", err)
			}
			if id.Kind != KindServer {
				return fmt.Errorf("checking server identity: %w: peer is a %s, not the bcd server", ErrBadIdentity, id.Kind)
			}
			return nil
		},
	}
	if len(cert.Certificate) > 0 {
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// anchor is CA certificate c as an agent trusts it: as a trust anchor, whose own path length
// constraint does not bind the paths below it (RFC 5280 §6.1 takes a trust anchor's name and
// key, not its constraints; Go's verifier applies them). The CAs CreateCA makes have path
// length 0, which would refuse the one intermediate of a rotation's overlap, the new CA
// cross-signed by the previous one (CrossSign); that certificate has path length 0 itself, so a
// path is at most leaf, cross-signed CA, anchor. The CAs sign no other CA certificate, and a
// leaf they signed is never taken as an intermediate (not a CA).
func anchor(c *x509.Certificate) *x509.Certificate {
	if !c.BasicConstraintsValid || c.MaxPathLen != 0 {
		return c
	}
	a := *c
	a.MaxPathLen, a.MaxPathLenZero = 1, false
	return &a
}

// TLSCertificate pairs an issued certificate with the agent's in-RAM key for ClientTLSConfig.
func TLSCertificate(certDER []byte, key crypto.Signer) (tls.Certificate, error) {
	leaf, err := x509.ParseCertificate(certDER)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("building TLS certificate: %w: %w", ErrCertInvalid, err)
	}
	pub, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(key.Public()) {
		return tls.Certificate{}, fmt.Errorf("building TLS certificate %q: %w: key does not match the certificate", leaf.Subject.CommonName, ErrBadInput)
	}
	return tls.Certificate{Certificate: [][]byte{certDER}, PrivateKey: key, Leaf: leaf}, nil
}

// IdentityFromTLS returns the identity of the peer's certificate when the handshake verified
// it (state.VerifiedChains); a connection without a verified client certificate has none.
func IdentityFromTLS(state *tls.ConnectionState) (Identity, bool) {
	if state == nil || len(state.VerifiedChains) == 0 || len(state.VerifiedChains[0]) == 0 {
		return Identity{}, false
	}
	id, err := ParseIdentity(state.VerifiedChains[0][0])
	if err != nil {
		return Identity{}, false
	}
	return id, true
}

// RefusalHeader names the metadata key of a gateway refusal that says why, where the agent
// acts on the reason; RefusalCertExpired is its value for a certificate past its validity.
const (
	RefusalHeader      = "Bcd-Refusal"
	RefusalCertExpired = "certificate-expired"
)
