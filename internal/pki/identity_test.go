package pki

import (
	"crypto/x509"
	"errors"
	"math"
	"net/url"
	"strings"
	"testing"
)

func allKindsIdentities() []Identity {
	return []Identity{
		SiteAgentIdentity("nyc-1", "agent-a"),
		NodeIdentity("node-0001", 0),
		NodeIdentity("n.1_2-3", math.MaxUint64),
		NodeTenantIdentity("node-0001", "tenant-x", 7),
		ServerIdentity(),
	}
}

func TestKindTableCoversEveryKind(t *testing.T) {
	names := map[string]bool{}
	for k := KindSiteAgent; k <= KindServer; k++ {
		s, ok := specOf(k)
		if !ok {
			t.Fatalf("kind %d has no table row", k)
		}
		if names[s.name] {
			t.Fatalf("duplicate kind name %q", s.name)
		}
		names[s.name] = true
		if got, ok := specNamed(k.String()); !ok || got.kind != k {
			t.Fatalf("specNamed(%q) = %v, %v", k.String(), got.kind, ok)
		}
	}
	if _, ok := specOf(KindUnknown); ok {
		t.Fatal("KindUnknown has a table row")
	}
	if got := Kind(99).String(); got != "unknown(99)" {
		t.Fatalf("Kind(99).String() = %q", got)
	}
}

func TestCanAttestOnlyNode(t *testing.T) {
	for k := KindUnknown; k <= KindServer+1; k++ {
		if got, want := (Identity{Kind: k}).CanAttest(), k == KindNode; got != want {
			t.Errorf("%s CanAttest = %v, want %v", k, got, want)
		}
	}
}

func TestIdentityURIRoundTrip(t *testing.T) {
	wantURIs := []string{
		"bcd://site-agent/nyc-1/agent-a",
		"bcd://node/node-0001/0",
		"bcd://node/n.1_2-3/18446744073709551615",
		"bcd://node-tenant/node-0001/7/tenant-x",
		"bcd://server",
	}
	for i, id := range allKindsIdentities() {
		t.Run(id.Kind.String(), func(t *testing.T) {
			if err := id.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if got := id.URI(); got != wantURIs[i] {
				t.Fatalf("URI = %q, want %q", got, wantURIs[i])
			}
			got, err := ParseIdentityURI(id.URI())
			if err != nil {
				t.Fatalf("ParseIdentityURI: %v", err)
			}
			if got != id {
				t.Fatalf("round trip = %+v, want %+v", got, id)
			}
		})
	}
}

func TestIdentityValidate(t *testing.T) {
	long := strings.Repeat("a", MaxIDLength+1)
	tests := []struct {
		name string
		id   Identity
		ok   bool
	}{
		{"site agent", SiteAgentIdentity("s", "a"), true},
		{"site agent max length", SiteAgentIdentity(strings.Repeat("s", MaxIDLength), "a"), true},
		{"site agent empty site", SiteAgentIdentity("", "a"), false},
		{"site agent empty agent", SiteAgentIdentity("s", ""), false},
		{"site agent long id", SiteAgentIdentity(long, "a"), false},
		{"site agent slash", SiteAgentIdentity("s/x", "a"), false},
		{"site agent with node", Identity{Kind: KindSiteAgent, SiteID: "s", AgentID: "a", NodeID: "n"}, false},
		{"site agent with generation", Identity{Kind: KindSiteAgent, SiteID: "s", AgentID: "a", Generation: 1}, false},
		{"node", NodeIdentity("n", 3), true},
		{"node leading dot", NodeIdentity(".n", 3), false},
		{"node dotdot", NodeIdentity("..", 3), false},
		{"node percent", NodeIdentity("n%2F", 3), false},
		{"node space", NodeIdentity("n 1", 3), false},
		{"node unicode", NodeIdentity("nö", 3), false},
		{"node with tenant", Identity{Kind: KindNode, NodeID: "n", TenantID: "t"}, false},
		{"node with site", Identity{Kind: KindNode, NodeID: "n", SiteID: "s"}, false},
		{"tenant", NodeTenantIdentity("n", "t", 0), true},
		{"tenant no tenant", NodeTenantIdentity("n", "", 0), false},
		{"tenant with agent", Identity{Kind: KindNodeTenant, NodeID: "n", TenantID: "t", AgentID: "a"}, false},
		{"server", ServerIdentity(), true},
		{"server with node", Identity{Kind: KindServer, NodeID: "n"}, false},
		{"server with generation", Identity{Kind: KindServer, Generation: 2}, false},
		{"unknown kind", Identity{}, false},
		{"kind out of range", Identity{Kind: 42}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.id.Validate()
			if tt.ok {
				wantErr(t, err, nil)
			} else {
				wantErr(t, err, ErrBadIdentity)
			}
		})
	}
}

func TestParseIdentityURIRejects(t *testing.T) {
	bad := []string{
		"",
		"bcd:",
		"bcd://",
		"bcd:node/n/1",
		"BCD://node/n/1",
		"https://node/n/1",
		"bcd://node/n",
		"bcd://node/n/1/",
		"bcd://node/n/1/x",
		"bcd://node//1",
		"bcd://node/n/01",
		"bcd://node/n/+1",
		"bcd://node/n/-1",
		"bcd://node/n/1.0",
		"bcd://node/n/18446744073709551616",
		"bcd://node/n/999999999999999999999",
		"bcd://node/n%2Fx/1",
		"bcd://node/n/1?x=1",
		"bcd://node/n/1#f",
		"bcd://user@node/n/1",
		"bcd://node:80/n/1",
		"bcd://Node/n/1",
		"bcd://server/",
		"bcd://server/x",
		"bcd://site-agent/s",
		"bcd://site-agent/s/a/b",
		"bcd://node-tenant/n/1",
		"bcd://node-tenant/n/t/1",
		"bcd://unknown",
		"bcd://node/" + strings.Repeat("n", MaxIDLength+1) + "/1",
	}
	for _, s := range bad {
		t.Run(s, func(t *testing.T) {
			id, err := ParseIdentityURI(s)
			if !errors.Is(err, ErrBadIdentity) {
				t.Fatalf("ParseIdentityURI(%q) = %+v, %v; want ErrBadIdentity", s, id, err)
			}
		})
	}
}

func certWithURIs(uris ...string) *x509.Certificate {
	c := &x509.Certificate{}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			panic(err)
		}
		c.URIs = append(c.URIs, u)
	}
	return c
}

func TestParseIdentityURISANs(t *testing.T) {
	tests := []struct {
		name string
		cert *x509.Certificate
		want Identity
		ok   bool
	}{
		{"one", certWithURIs("bcd://node/n/1"), NodeIdentity("n", 1), true},
		{"other schemes ignored", certWithURIs("spiffe://x/y", "bcd://node/n/1"), NodeIdentity("n", 1), true},
		{"none", certWithURIs(), Identity{}, false},
		{"only other scheme", certWithURIs("spiffe://x/y"), Identity{}, false},
		{"two", certWithURIs("bcd://node/n/1", "bcd://node/m/1"), Identity{}, false},
		{"upper-case scheme counts", certWithURIs("bcd://node/n/1", "BCD://node/m/1"), Identity{}, false},
		{"malformed", certWithURIs("bcd://node/n/x"), Identity{}, false},
		{"nil", nil, Identity{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseIdentity(tt.cert)
			if !tt.ok {
				wantErr(t, err, ErrBadIdentity)
				return
			}
			wantErr(t, err, nil)
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestValidateIDCharset(t *testing.T) {
	// Every single byte, as the first and as a later character.
	for c := 0; c < 256; c++ {
		b := byte(c)
		alnum := b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
		punct := b == '.' || b == '_' || b == '-'
		if got := ValidateID(string([]byte{b})) == nil; got != alnum {
			t.Errorf("ValidateID(%q) ok=%v, want %v", b, got, alnum)
		}
		if got := ValidateID(string([]byte{'x', b})) == nil; got != (alnum || punct) {
			t.Errorf("ValidateID(%q) ok=%v, want %v", "x"+string(b), got, alnum || punct)
		}
	}
}

// FuzzParseIdentityURI: a parse that succeeds is canonical (the URI re-encodes to the input)
// and valid; a parse never panics.
func FuzzParseIdentityURI(f *testing.F) {
	for _, id := range allKindsIdentities() {
		f.Add(id.URI())
	}
	for _, s := range []string{"", "bcd://", "bcd://node/n/01", "bcd://node/n%2F/1", "bcd://node-tenant/n/1/t?x",
		"bcd://site-agent/s/a/", "bcd://server", "bcd://node/n/18446744073709551616", "bcd://node/\x00/1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseIdentityURI(s)
		if err != nil {
			if !errors.Is(err, ErrBadIdentity) {
				t.Fatalf("error %v does not wrap ErrBadIdentity", err)
			}
			return
		}
		if err := id.Validate(); err != nil {
			t.Fatalf("parsed identity %+v invalid: %v", id, err)
		}
		if id.URI() != s {
			t.Fatalf("parsed %q but re-encodes as %q", s, id.URI())
		}
		// The same string through url.Parse, as x509 does with a SAN, yields the same identity.
		u, err := url.Parse(s)
		if err != nil {
			t.Fatalf("canonical URI %q does not parse as a URL: %v", s, err)
		}
		got, err := ParseIdentity(&x509.Certificate{URIs: []*url.URL{u}})
		if err != nil || got != id {
			t.Fatalf("ParseIdentity via URL = %+v, %v; want %+v", got, err, id)
		}
	})
}
