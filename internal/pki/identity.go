package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Kind says what a certificate's holder is. It decides what the holder may do: only KindNode
// attests results, only KindSiteAgent signs site statements, KindNodeTenant only authenticates.
type Kind uint8

const (
	KindUnknown    Kind = iota
	KindSiteAgent       // a `bcd site` agent: site ID + agent ID
	KindNode            // the platform identity of a node (ramdisk, node agent): node ID + generation
	KindNodeTenant      // a lessee's certificate for a node: node ID + generation + tenant ID; never attests
	KindServer          // the control plane's TLS server certificate
)

// URIScheme is the scheme of the URI SAN that carries a bcd identity.
const URIScheme = "bcd"

// MaxIDLength bounds site, agent, node and tenant IDs.
const MaxIDLength = 128

// kindSpec is one row of the identity table: how a kind is spelled in its URI and which fields
// it carries. The URI is bcd://<name>/<field>/<field>…, fields in the order listed.
type kindSpec struct {
	kind   Kind
	name   string
	fields []field
	// What a certificate of this kind is for: the TLS side it authenticates, and whether its
	// key may receive secrets by ECDH (JWE to an agent).
	extKeyUsage  x509.ExtKeyUsage
	keyAgreement bool
}

type field uint8

const (
	fieldSite field = iota + 1
	fieldAgent
	fieldNode
	fieldGeneration
	fieldTenant
)

// kindTable is the identity table as data. It is a function so that the table cannot be
// modified by anyone at run time.
func kindTable() []kindSpec {
	return []kindSpec{
		{KindSiteAgent, "site-agent", []field{fieldSite, fieldAgent}, x509.ExtKeyUsageClientAuth, true},
		{KindNode, "node", []field{fieldNode, fieldGeneration}, x509.ExtKeyUsageClientAuth, true},
		{KindNodeTenant, "node-tenant", []field{fieldNode, fieldGeneration, fieldTenant}, x509.ExtKeyUsageClientAuth, false},
		{KindServer, "server", nil, x509.ExtKeyUsageServerAuth, false},
	}
}

func specOf(k Kind) (kindSpec, bool) {
	for _, s := range kindTable() {
		if s.kind == k {
			return s, true
		}
	}
	return kindSpec{}, false
}

func specNamed(name string) (kindSpec, bool) {
	for _, s := range kindTable() {
		if s.name == name {
			return s, true
		}
	}
	return kindSpec{}, false
}

// String returns the kind's name as spelled in identity URIs ("site-agent", "node", …).
func (k Kind) String() string {
	if s, ok := specOf(k); ok {
		return s.name
	}
	return "unknown(" + strconv.Itoa(int(k)) + ")"
}

// Identity is who a bcd certificate names. Only the fields of its Kind are set; the others are
// zero. Construct it with the Kind's fields and call Validate, or get it from ParseIdentity.
type Identity struct {
	Kind       Kind
	SiteID     string // KindSiteAgent
	AgentID    string // KindSiteAgent
	NodeID     string // KindNode, KindNodeTenant
	Generation uint64 // KindNode, KindNodeTenant
	TenantID   string // KindNodeTenant
}

// SiteAgentIdentity, NodeIdentity, NodeTenantIdentity and ServerIdentity build identities.
func SiteAgentIdentity(siteID, agentID string) Identity {
	return Identity{Kind: KindSiteAgent, SiteID: siteID, AgentID: agentID}
}

func NodeIdentity(nodeID string, generation uint64) Identity {
	return Identity{Kind: KindNode, NodeID: nodeID, Generation: generation}
}

func NodeTenantIdentity(nodeID, tenantID string, generation uint64) Identity {
	return Identity{Kind: KindNodeTenant, NodeID: nodeID, Generation: generation, TenantID: tenantID}
}

func ServerIdentity() Identity { return Identity{Kind: KindServer} }

// CanAttest reports whether the identity may sign attested results of a node: only a platform
// node identity can. A node-tenant certificate authenticates its holder but never attests.
func (id Identity) CanAttest() bool { return id.Kind == KindNode }

// Validate checks that the identity has exactly the fields of its kind, each well formed.
func (id Identity) Validate() error {
	spec, ok := specOf(id.Kind)
	if !ok {
		return fmt.Errorf("%w: unknown identity kind %d", ErrBadIdentity, id.Kind)
	}
	want := map[field]bool{}
	for _, f := range spec.fields {
		want[f] = true
	}
	strs := []struct {
		f    field
		name string
		v    string
	}{
		{fieldSite, "site ID", id.SiteID},
		{fieldAgent, "agent ID", id.AgentID},
		{fieldNode, "node ID", id.NodeID},
		{fieldTenant, "tenant ID", id.TenantID},
	}
	for _, s := range strs {
		switch {
		case want[s.f]:
			if err := ValidateID(s.v); err != nil {
				return fmt.Errorf("%w: %s identity: %s: %w", ErrBadIdentity, id.Kind, s.name, err)
			}
		case s.v != "":
			return fmt.Errorf("%w: %s identity must not carry a %s", ErrBadIdentity, id.Kind, s.name)
		}
	}
	if !want[fieldGeneration] && id.Generation != 0 {
		return fmt.Errorf("%w: %s identity must not carry a generation", ErrBadIdentity, id.Kind)
	}
	return nil
}

// URI returns the identity's URI SAN, e.g. bcd://node/n-42/7. It is only meaningful for a valid
// identity; ParseIdentityURI(id.URI()) == id for every identity that passes Validate.
func (id Identity) URI() string {
	spec, ok := specOf(id.Kind)
	if !ok {
		return URIScheme + "://unknown"
	}
	var b strings.Builder
	b.WriteString(URIScheme + "://" + spec.name)
	for _, f := range spec.fields {
		b.WriteByte('/')
		switch f {
		case fieldSite:
			b.WriteString(id.SiteID)
		case fieldAgent:
			b.WriteString(id.AgentID)
		case fieldNode:
			b.WriteString(id.NodeID)
		case fieldGeneration:
			b.WriteString(strconv.FormatUint(id.Generation, 10))
		case fieldTenant:
			b.WriteString(id.TenantID)
		}
	}
	return b.String()
}

// String is the identity's URI: IDs are not secret.
func (id Identity) String() string { return id.URI() }

// ValidateID checks a site, agent, node or tenant ID: 1 to MaxIDLength characters of
// [A-Za-z0-9._-], starting with a letter or digit. IDs appear in URIs, paths and log lines
// unescaped, so nothing else is accepted.
func ValidateID(s string) error {
	if s == "" {
		return errors.New("empty ID")
	}
	if len(s) > MaxIDLength {
		return fmt.Errorf("ID of %d bytes is longer than %d", len(s), MaxIDLength)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return fmt.Errorf("ID %q must start with a letter or digit", s)
		}
		if !alnum && c != '.' && c != '_' && c != '-' {
			return fmt.Errorf("ID %q has character %q: allowed are letters, digits, '.', '_', '-'", s, c)
		}
	}
	return nil
}

// ParseIdentityURI parses an identity URI as written by Identity.URI. Only the canonical
// spelling is accepted (no escapes, query, fragment, user info, port, leading zeros…): the
// parse of s succeeds if and only if s == id.URI() for the returned, valid id.
func ParseIdentityURI(s string) (Identity, error) {
	const prefix = URIScheme + "://"
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return Identity{}, fmt.Errorf("%w: %q does not start with %s", ErrBadIdentity, truncate(s), prefix)
	}
	parts := strings.Split(rest, "/")
	spec, ok := specNamed(parts[0])
	if !ok {
		return Identity{}, fmt.Errorf("%w: unknown identity kind in %q", ErrBadIdentity, truncate(s))
	}
	if len(parts)-1 != len(spec.fields) {
		return Identity{}, fmt.Errorf("%w: %s identity URI %q has %d fields, want %d",
			ErrBadIdentity, spec.name, truncate(s), len(parts)-1, len(spec.fields))
	}
	id := Identity{Kind: spec.kind}
	for i, f := range spec.fields {
		v := parts[i+1]
		switch f {
		case fieldSite:
			id.SiteID = v
		case fieldAgent:
			id.AgentID = v
		case fieldNode:
			id.NodeID = v
		case fieldTenant:
			id.TenantID = v
		case fieldGeneration:
			g, err := parseGeneration(v)
			if err != nil {
				return Identity{}, fmt.Errorf("%w: identity URI %q: %w", ErrBadIdentity, truncate(s), err)
			}
			id.Generation = g
		}
	}
	if err := id.Validate(); err != nil {
		return Identity{}, err
	}
	if id.URI() != s { // belt and braces: only the canonical form
		return Identity{}, fmt.Errorf("%w: identity URI %q is not canonical", ErrBadIdentity, truncate(s))
	}
	return id, nil
}

// parseGeneration accepts a canonical decimal uint64: digits only, no sign, no leading zero.
func parseGeneration(v string) (uint64, error) {
	if v == "" || len(v) > 20 {
		return 0, fmt.Errorf("bad generation %q", v)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, fmt.Errorf("bad generation %q: digits only", v)
		}
	}
	if len(v) > 1 && v[0] == '0' {
		return 0, fmt.Errorf("bad generation %q: leading zero", v)
	}
	g, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad generation %q: %w", v, err)
	}
	return g, nil
}

// ParseIdentity reads the bcd identity from a certificate's URI SANs. The certificate must carry
// exactly one URI with the bcd scheme. ParseIdentity does not verify the certificate: use
// (*CA).Verify or IdentityFromTLS for that.
func ParseIdentity(cert *x509.Certificate) (Identity, error) {
	if cert == nil {
		return Identity{}, fmt.Errorf("%w: no certificate", ErrBadIdentity)
	}
	var found []*url.URL
	for _, u := range cert.URIs {
		if u != nil && strings.EqualFold(u.Scheme, URIScheme) {
			found = append(found, u)
		}
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("%w: certificate %q has no %s:// URI SAN", ErrBadIdentity, cert.Subject.CommonName, URIScheme)
	case 1:
	default:
		return Identity{}, fmt.Errorf("%w: certificate %q has %d %s:// URI SANs, want one", ErrBadIdentity, cert.Subject.CommonName, len(found), URIScheme)
	}
	id, err := ParseIdentityURI(found[0].String())
	if err != nil {
		return Identity{}, fmt.Errorf("reading identity of certificate %q: %w", cert.Subject.CommonName, err)
	}
	return id, nil
}

// truncate keeps hostile input from making error messages huge.
func truncate(s string) string {
	const limit = 200
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}
