package agentlink

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"

	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/gen/agentv1/agentv1connect"
	"bcd/internal/pki"
)

// Files in DataDir.
const (
	KeyFile  = "agent.key"
	CertFile = "agent.crt"
	CAFile   = "ca.pem"
)

// identity is the agent's key, certificate and trusted CA. It is never changed once parsed:
// a renewal makes a new one.
type identity struct {
	key     crypto.Signer
	certDER []byte
	caPEM   []byte
	id      pki.Identity
	tls     tls.Certificate // key and certificate, with the parsed leaf
}

// loadIdentity reads a stored identity; ok is false when none is stored.
func loadIdentity(dir string) (_ *identity, ok bool, err error) {
	if dir == "" {
		return nil, false, nil
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, CertFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("loading agent identity: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, false, fmt.Errorf("loading agent identity: %w", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, CAFile))
	if err != nil {
		return nil, false, fmt.Errorf("loading agent identity: %w", err)
	}
	key, err := pki.ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, false, fmt.Errorf("loading agent identity: %w", err)
	}
	der, err := pki.DecodeCertPEM(certPEM)
	if err != nil {
		return nil, false, fmt.Errorf("loading agent identity: %w", err)
	}
	i := &identity{key: key, certDER: der, caPEM: caPEM}
	if err := i.parse(); err != nil {
		return nil, false, fmt.Errorf("loading agent identity from %s: %w", dir, err)
	}
	return i, true, nil
}

func (i *identity) parse() error {
	c, err := pki.TLSCertificate(i.certDER, i.key)
	if err != nil {
		return err
	}
	i.id, err = pki.ParseIdentity(c.Leaf)
	i.tls = c
	return err
}

// expired reports whether the certificate is past its NotAfter at now.
func (i *identity) expired(now time.Time) bool { return now.After(i.tls.Leaf.NotAfter) }

// store writes the identity to dir, key first; each file replaced atomically, mode 0600.
func (i *identity) store(dir string) error {
	if dir == "" {
		return nil
	}
	keyPEM, err := pki.EncodeKeyPEM(i.key)
	if err != nil {
		return fmt.Errorf("storing agent identity: %w", err)
	}
	if err := replaceFiles(dir, namedFile{KeyFile, keyPEM}, namedFile{CAFile, i.caPEM}, namedFile{CertFile, pki.EncodeCertPEM(i.certDER)}); err != nil {
		return fmt.Errorf("storing agent identity: %w", err)
	}
	return nil
}

// transport is an HTTP/2-only client transport trusting caPEM, presenting the certificate
// cert returns at each handshake (nil: none, to join). With conns, its connections are
// recorded there (a link's, which closes them all when it ends).
func transport(cfg *Config, caPEM []byte, cert func() tls.Certificate, conns *connSet) (*http.Transport, error) {
	u, err := url.Parse(cfg.GatewayURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("gateway URL %q: must be https://host[:port]", cfg.GatewayURL)
	}
	tc := pki.ClientTLSConfig(caPEM, tls.Certificate{})
	if cert != nil {
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := cert()
			return &c, nil
		}
	}
	tc.ServerName = cfg.ServerName
	if tc.ServerName == "" {
		tc.ServerName = u.Hostname()
	}
	var protos http.Protocols
	protos.SetHTTP2(true)
	dial := cfg.Dial
	if dial == nil {
		// As http.DefaultTransport dials.
		dial = (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	if conns != nil {
		dial = conns.dialer(dial)
	}
	return &http.Transport{
		DialContext:         dial,
		TLSClientConfig:     tc,
		Protocols:           &protos,
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
		// A replaced wire's connections (rewire) close once idle this long.
		IdleConnTimeout: 2 * time.Minute,
		// A connection is dead after three silent heartbeat intervals, as a stream is (send):
		// a ping after one, unanswered for two more. A shorter bound cut joins and streams of a
		// gateway that was merely slow (a loaded host) with "http2: client connection lost".
		HTTP2: &http.HTTP2Config{
			SendPingTimeout: cfg.HeartbeatInterval,
			PingTimeout:     2 * cfg.HeartbeatInterval,
		},
	}, nil
}

// token is the join token configured for the agent's kind ("" none).
func (cfg *Config) token() string {
	if cfg.Kind == KindNode {
		return cfg.DiscoveryToken
	}
	return cfg.JoinToken
}

// join exchanges the configured token and a new key's CSR for a certificate.
func join(ctx context.Context, cfg *Config) (*identity, error) {
	if len(cfg.CAPEM) == 0 {
		return nil, errors.New("joining: no CA to trust (a site agent's: --ca-file, the CA certificate bcd site join-token prints; a ramdisk's: bcd.ca on its kernel command line)")
	}
	req := &agentv1.JoinRequest{}
	switch cfg.Kind {
	case KindSite:
		req.Kind, req.Token = agentv1.AgentKind_AGENT_KIND_SITE, cfg.JoinToken
	case KindNode:
		req.Kind, req.Token = agentv1.AgentKind_AGENT_KIND_NODE, cfg.DiscoveryToken
		req.Hints = &agentv1.NodeHints{ProductUuid: cfg.Hints.ProductUUID, Macs: cfg.Hints.MACs}
	}
	if req.Token == "" {
		return nil, fmt.Errorf("joining as %s agent: no token configured (a site agent's: --join-token or $BCD_SITE_JOIN_TOKEN, minted by bcd site join-token SITE; a ramdisk's: bcd.token on its kernel command line)", cfg.Kind)
	}
	key, csr, err := joinKey(cfg)
	if err != nil {
		return nil, fmt.Errorf("joining: %w", err)
	}
	req.CsrDer = csr
	tr, err := transport(cfg, cfg.CAPEM, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("joining: %w", err)
	}
	defer tr.CloseIdleConnections()
	client := agentv1connect.NewGatewayServiceClient(&http.Client{Transport: tr}, cfg.GatewayURL)
	resp, err := client.Join(ctx, connect.NewRequest(req))
	if err != nil {
		if c := connect.CodeOf(err); c == connect.CodeUnauthenticated || c == connect.CodePermissionDenied || c == connect.CodeInvalidArgument {
			return nil, fmt.Errorf("joining as %s agent: %w: %w", cfg.Kind, ErrRefused, err)
		}
		return nil, fmt.Errorf("joining as %s agent: %w", cfg.Kind, err)
	}
	i := &identity{key: key, certDER: resp.Msg.GetCertDer(), caPEM: cfg.CAPEM}
	if err := i.parse(); err != nil {
		return nil, fmt.Errorf("joining: the gateway's certificate: %w", err)
	}
	// The CAs the answer names (a rotation's bundle) are taken as a renewal's are: only one or
	// two CA certificates, one of which issued the agent's certificate; else the agent keeps
	// trusting the CA it joined with.
	if ca := resp.Msg.GetCaPem(); len(ca) > 0 {
		if err := pki.CheckBundle(ca, i.tls.Leaf); err != nil {
			cfg.Logger.Warn("the gateway's join answer names CAs the agent does not take; it trusts the CA it joined with", "error", err)
		} else {
			i.caPEM = ca
		}
	}
	return i, nil
}

// pendingJoinKey returns the key an agent that has no identity yet joins with: the one in dir
// (KeyFile) when an earlier attempt wrote it, else a new one, written there first.
func pendingJoinKey(dir string) (crypto.Signer, error) {
	p := filepath.Join(dir, KeyFile)
	if b, err := os.ReadFile(p); err == nil {
		key, err := pki.ParseKeyPEM(b)
		if err != nil {
			return nil, fmt.Errorf("loading the key of an earlier join attempt: %w", err)
		}
		return key, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("loading the key of an earlier join attempt: %w", err)
	}
	key, _, err := pki.NewKeyAndCSR("bcd agent")
	if err != nil {
		return nil, fmt.Errorf("making the join key: %w", err)
	}
	keyPEM, err := pki.EncodeKeyPEM(key)
	if err != nil {
		return nil, fmt.Errorf("making the join key: %w", err)
	}
	if err := replaceFiles(dir, namedFile{KeyFile, keyPEM}); err != nil {
		return nil, fmt.Errorf("storing the join key: %w", err)
	}
	return key, nil
}

// joinKey is the key a join certifies: Config.Key when given (so a join retried after its
// answer was lost presents the same key, which the control plane accepts again), else a new one.
func joinKey(cfg *Config) (crypto.Signer, []byte, error) {
	cn := "bcd " + cfg.Kind.String() + " agent"
	if cfg.Key == nil {
		return pki.NewKeyAndCSR(cn)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn}}, cfg.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("making a CSR for the configured key: %w", err)
	}
	return cfg.Key, csr, nil
}
