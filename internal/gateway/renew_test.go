package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/pki"
)

// Renew certifies the caller's identity and key again, for the lifetime it had; it needs the
// caller's certificate and refuses a node identity of an older generation or a server's.
func TestRenew(t *testing.T) {
	env := start(t)
	env.Identities.SetGeneration("n7", 3)
	env.Identities.SetGeneration("n8", 5)
	const ttl = 2 * time.Hour
	issue := func(id pki.Identity) tls.Certificate {
		key, der := csr(t)
		var cert []byte
		var err error
		switch id.Kind {
		case pki.KindSiteAgent:
			cert, err = env.CA.IssueSiteAgent(der, id.SiteID, id.AgentID, ttl, time.Now())
		case pki.KindNode:
			cert, err = env.CA.IssueNode(der, id.NodeID, id.Generation, ttl, time.Now())
		case pki.KindNodeTenant:
			cert, err = env.CA.IssueNodeTenant(der, id.NodeID, id.TenantID, id.Generation, ttl, time.Now())
		}
		if err != nil {
			t.Fatal(err)
		}
		c, err := pki.TLSCertificate(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, tc := range []struct {
		name string
		id   pki.Identity // zero: no client certificate
		code connect.Code // 0: renewed
	}{
		{"site agent", pki.SiteAgentIdentity("s1", "a1"), 0},
		{"node at its generation", pki.NodeIdentity("n7", 3), 0},
		{"node tenant at its generation", pki.NodeTenantIdentity("n8", "t1", 5), 0},
		{"node of an older generation", pki.NodeIdentity("n7", 2), connect.CodePermissionDenied},
		{"unknown node", pki.NodeIdentity("n9", 1), connect.CodePermissionDenied},
		{"no client certificate", pki.Identity{}, connect.CodeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cert tls.Certificate
			if tc.id.Kind != pki.KindUnknown {
				cert = issue(tc.id)
			}
			before := time.Now().Truncate(time.Second)
			resp, err := rawClient(t, env, cert).Renew(context.Background(), connect.NewRequest(&agentv1.RenewRequest{}))
			if tc.code != 0 {
				if connect.CodeOf(err) != tc.code {
					t.Fatalf("renewing %s: %v, want %v", tc.id, err, tc.code)
				}
				return
			}
			if err != nil {
				t.Fatalf("renewing %s: %v", tc.id, err)
			}
			got, id, err := env.CA.Verify(resp.Msg.GetCertDer(), time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if id != tc.id {
				t.Fatalf("renewed %s, want %s", id, tc.id)
			}
			if !got.PublicKey.(*ecdsa.PublicKey).Equal(cert.Leaf.PublicKey) {
				t.Fatal("the renewed certificate names another key")
			}
			if life := pki.Lifetime(got.NotBefore, got.NotAfter); got.NotAfter.Before(before.Add(ttl)) || life > ttl+time.Second || life < ttl-time.Second {
				t.Fatalf("renewed until %s (lifetime %s), want %s from now", got.NotAfter, life, ttl)
			}
			if got.SerialNumber.Cmp(cert.Leaf.SerialNumber) == 0 {
				t.Fatal("the same certificate came back")
			}
			if string(resp.Msg.GetCaPem()) != string(env.CA.CertPEM()) {
				t.Fatal("the answer carries another CA")
			}
		})
	}
}
