package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/tls"
	"fmt"
	"sync"
	"time"
)

// A certificate is renewed once RenewFraction of its lifetime has passed: a third of it is left
// for the renewal to succeed (the control plane may be away for a while), and a renewed
// certificate replaces one with plenty of life left, never one about to expire.
const RenewFraction = 2.0 / 3

// Lifetime is how long a certificate valid from notBefore to notAfter was made to live: from
// when the CA signed it (ClockSkew after its NotBefore) to its NotAfter. Pure.
func Lifetime(notBefore, notAfter time.Time) time.Duration {
	return notAfter.Sub(notBefore.Add(ClockSkew))
}

// RenewAt is when a certificate valid from notBefore to notAfter is due for renewal. Pure.
func RenewAt(notBefore, notAfter time.Time) time.Time {
	return notBefore.Add(ClockSkew).Add(time.Duration(float64(Lifetime(notBefore, notAfter)) * RenewFraction))
}

// Renew certifies again the identity and key of certDER, a client certificate this CA issued
// that is valid at now, for ttl from now. Only agents' kinds are renewed (site agent, node,
// node tenant): the server's certificate is made by its own server (ServerCert). The caller
// decides whether the identity may still be certified (a node's generation, say): Renew only
// checks the certificate.
func (ca *CA) Renew(certDER []byte, ttl time.Duration, now time.Time) ([]byte, error) {
	cert, id, err := ca.Verify(certDER, now)
	if err != nil {
		return nil, fmt.Errorf("renewing certificate: %w", err)
	}
	switch id.Kind {
	case KindSiteAgent, KindNode, KindNodeTenant:
	default:
		return nil, fmt.Errorf("renewing certificate: %w: a %s certificate is not renewed by its holder", ErrBadIdentity, id.Kind)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("renewing certificate: %w: not an ECDSA key", ErrBadInput)
	}
	der, err := ca.issue(pub, id, nil, nil, ttl, now)
	if err != nil {
		return nil, fmt.Errorf("renewing %s certificate: %w", id.Kind, err)
	}
	return der, nil
}

// ServerCert is the control plane's TLS server certificate for the agent gateway. It is issued
// by the CA for hosts when made, and again, with a new key, by the first handshake after
// RenewAt: a server that runs longer than a certificate lives keeps serving. Handshakes that
// began before a renewal finish with the certificate they got. During a rotation's overlap the
// certificate is presented with the active CA cross-signed by the previous one after it
// (SetRotation, CrossSign), so that agents that trust only the previous CA still verify it.
type ServerCert struct {
	ca    *CA
	hosts []string
	ttl   time.Duration
	now   func() time.Time

	mu      sync.Mutex
	leaf    *tls.Certificate // the issued certificate and its key alone
	renewAt time.Time
	issuer  string // fingerprint of the CA that was active when leaf was issued
	// cur is what handshakes get: leaf, then the cross-signed CA of set when that issued leaf.
	cur *tls.Certificate
	set *caSet // the CAs cur was chained for (nil: chain again)
}

// NewServerCert issues the first certificate (now is the clock; nil: time.Now).
func NewServerCert(ca *CA, hosts []string, ttl time.Duration, now func() time.Time) (*ServerCert, error) {
	if ca == nil {
		return nil, fmt.Errorf("issuing the server certificate: %w: no CA", ErrBadInput)
	}
	if now == nil {
		now = time.Now
	}
	s := &ServerCert{ca: ca, hosts: hosts, ttl: ttl, now: now}
	if err := s.issue(now()); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *ServerCert) issue(now time.Time) error {
	issuer := s.ca.Fingerprint() // read first: a CA activated meanwhile makes the next handshake issue again
	certPEM, keyPEM, err := s.ca.IssueServer(s.hosts, s.ttl, now)
	if err != nil {
		return err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("loading the server certificate: %w", err)
	}
	s.leaf, s.renewAt, s.issuer, s.set = &pair, RenewAt(pair.Leaf.NotBefore, pair.Leaf.NotAfter), issuer, nil
	s.chain()
	return nil
}

// chain sets cur for the CAs in force now: the leaf alone, or followed by the active CA
// cross-signed by the previous one when that CA issued the leaf (a rotation's overlap). It
// follows the stage at every handshake: finishing the rotation drops the cross-signed CA
// without issuing again.
func (s *ServerCert) chain() {
	set := s.ca.current()
	if set == s.set {
		return
	}
	cur := s.leaf
	if x := set.cross; x != nil && bytes.Equal(s.leaf.Leaf.RawIssuer, x.RawSubject) && s.leaf.Leaf.CheckSignatureFrom(x) == nil {
		c := *s.leaf
		c.Certificate = [][]byte{s.leaf.Certificate[0], x.Raw}
		cur = &c
	}
	s.cur, s.set = cur, set
}

// Current is the certificate handshakes get now, renewed first when due or when another CA
// became the active one (a rotation's activation: agents trust it by then). When a renewal fails
// the current certificate is served while it is valid, and the renewal is tried again at the
// next handshake.
func (s *ServerCert) Current() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if now.Before(s.renewAt) && s.issuer == s.ca.Fingerprint() {
		s.chain()
		return s.cur, nil
	}
	err := s.issue(now)
	if err != nil && now.After(s.leaf.Leaf.NotAfter) {
		return nil, fmt.Errorf("renewing the gateway's expired server certificate: %w", err)
	}
	s.chain()
	return s.cur, nil
}

// TLSConfig is the gateway's TLS configuration (as ServerTLSConfig) serving the current
// certificate at every handshake and verifying client certificates against the CAs trusted at
// that handshake (a rotation changes them while the server runs). Set NextProtos on it before
// serving: handshakes get a copy of it with the current CAs.
func (s *ServerCert) TLSConfig() *tls.Config {
	cfg := serverTLS(s.ca)
	cfg.GetCertificate = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.Current() }
	cfg.ClientCAs = s.ca.current().pool
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool := s.ca.current().pool
		if pool == cfg.ClientCAs {
			return nil, nil // the CAs it was made with
		}
		c := cfg.Clone()
		c.ClientCAs, c.GetConfigForClient = pool, nil
		return c, nil
	}
	return cfg
}
