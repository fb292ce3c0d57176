package gatewaytest

import (
	"context"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/pki"
)

// CertTTL is how long the fake's certificates are valid.
const CertTTL = 24 * time.Hour

type token struct {
	siteID, agentID, nodeID string
	expires                 time.Time
	used                    bool
}

// Identities is an in-memory gateway.Identities over a real CA: one-time expiring tokens
// (stored hashed), node identity generations and the hints nodes reported.
type Identities struct {
	ca *pki.CA

	mu      sync.Mutex
	tokens  map[string]*token // string(pki.HashToken(plain)) → token
	gens    map[string]uint64
	hints   map[string]gateway.NodeHints
	ttl     time.Duration
	renews  int
	revoked map[string]bool
}

var _ gateway.Identities = (*Identities)(nil)

// NewIdentities makes an empty registry issuing with ca.
func NewIdentities(ca *pki.CA) *Identities {
	return &Identities{ca: ca, tokens: map[string]*token{}, gens: map[string]uint64{}, hints: map[string]gateway.NodeHints{}, ttl: CertTTL}
}

// SetCertTTL sets the lifetime of the certificates issued from now on at join (default CertTTL).
func (f *Identities) SetCertTTL(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ttl = d
}

func (f *Identities) certTTL() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ttl
}

// Renewals counts the certificates renewed so far.
func (f *Identities) Renewals() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.renews
}

// SiteToken makes a bootstrap token for agent agentID of site siteID, valid for ttl (a
// negative ttl makes an already expired one).
func (f *Identities) SiteToken(siteID, agentID string, ttl time.Duration) string {
	return f.add(&token{siteID: siteID, agentID: agentID, expires: time.Now().Add(ttl)}, pki.JoinTokenPrefix)
}

// NodeToken makes a discovery token for node nodeID, valid for ttl. The node exists from now
// on, at generation 1 unless SetGeneration says otherwise.
func (f *Identities) NodeToken(nodeID string, ttl time.Duration) string {
	f.mu.Lock()
	if _, ok := f.gens[nodeID]; !ok {
		f.gens[nodeID] = 1
	}
	f.mu.Unlock()
	return f.add(&token{nodeID: nodeID, expires: time.Now().Add(ttl)}, pki.DiscoveryTokenPrefix)
}

// InstanceToken makes an installed OS's instance token for node nodeID (as
// boot.prepareInstance does), valid for ttl; the node exists as with NodeToken.
func (f *Identities) InstanceToken(nodeID string, ttl time.Duration) string {
	f.mu.Lock()
	if _, ok := f.gens[nodeID]; !ok {
		f.gens[nodeID] = 1
	}
	f.mu.Unlock()
	return f.add(&token{nodeID: nodeID, expires: time.Now().Add(ttl)}, pki.InstanceTokenPrefix)
}

func (f *Identities) add(t *token, prefix string) string {
	plain, hash, err := pki.NewToken(prefix)
	if err != nil {
		panic(fmt.Sprintf("making a token: %v", err)) // crypto/rand failed: nothing works
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokens[string(hash)] = t
	return plain
}

// SetGeneration sets a node's identity generation (metal.revokeIdentity bumps it).
func (f *Identities) SetGeneration(nodeID string, gen uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gens[nodeID] = gen
}

// Hints returns what node nodeID reported at its last join.
func (f *Identities) Hints(nodeID string) gateway.NodeHints {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hints[nodeID]
}

func (f *Identities) consume(plain string, node bool) (*token, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tokens[string(pki.HashToken(plain))]
	switch {
	case !ok:
		return nil, fmt.Errorf("unknown token: %w", gateway.ErrTokenRefused)
	case t.used:
		return nil, fmt.Errorf("token already used: %w", gateway.ErrTokenRefused)
	case time.Now().After(t.expires):
		return nil, fmt.Errorf("token expired: %w", gateway.ErrTokenRefused)
	case (t.nodeID != "") != node:
		return nil, fmt.Errorf("token of another agent kind: %w", gateway.ErrTokenRefused)
	}
	t.used = true
	return t, nil
}

// JoinSite implements gateway.Identities.
func (f *Identities) JoinSite(_ context.Context, plain string, csrDER []byte) ([]byte, error) {
	t, err := f.consume(plain, false)
	if err != nil {
		return nil, err
	}
	return f.ca.IssueSiteAgent(csrDER, t.siteID, t.agentID, f.certTTL(), time.Now())
}

// JoinNode implements gateway.Identities.
func (f *Identities) JoinNode(_ context.Context, plain string, csrDER []byte, hints gateway.NodeHints) ([]byte, error) {
	t, err := f.consume(plain, true)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	gen := f.gens[t.nodeID]
	f.hints[t.nodeID] = hints
	f.mu.Unlock()
	return f.ca.IssueNode(csrDER, t.nodeID, gen, f.certTTL(), time.Now())
}

// CurrentGeneration implements gateway.Identities.
func (f *Identities) CurrentGeneration(_ context.Context, nodeID string) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g, ok := f.gens[nodeID]
	if !ok {
		return 0, fmt.Errorf("node %s: %w", nodeID, gateway.ErrNotFound)
	}
	return g, nil
}

// RevokeSiteAgent makes site agent agentID's certificate refused from now on.
func (f *Identities) RevokeSiteAgent(agentID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.revoked == nil {
		f.revoked = map[string]bool{}
	}
	f.revoked[agentID] = true
}

// SiteAgentRevoked implements gateway.Identities.
func (f *Identities) SiteAgentRevoked(_ context.Context, agentID string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.revoked[agentID], nil
}

// Renew implements gateway.Identities: the same lifetime again, from now.
func (f *Identities) Renew(_ context.Context, id pki.Identity, certDER []byte) ([]byte, error) {
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, fmt.Errorf("renewing %s: %w", id, err)
	}
	f.mu.Lock()
	if id.Kind != pki.KindSiteAgent && f.gens[id.NodeID] != id.Generation {
		f.mu.Unlock()
		return nil, fmt.Errorf("renewing %s: %w", id, pki.ErrIdentityRevoked)
	}
	f.renews++
	f.mu.Unlock()
	return f.ca.Renew(certDER, pki.Lifetime(cert.NotBefore, cert.NotAfter), time.Now())
}
