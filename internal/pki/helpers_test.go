package pki

import (
	"crypto"
	"errors"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// t0 is the fixed "now" of the tests: certificates are issued at t0 and checked around it.
func t0() time.Time { return time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC) }

func newCA(t testing.TB) *CA {
	t.Helper()
	ca, err := CreateCA("test CA", t0())
	if err != nil {
		t.Fatalf("CreateCA: %v", err)
	}
	return ca
}

// issued is an identity's key and certificate.
type issued struct {
	key  crypto.Signer
	cert []byte
}

func issue(t testing.TB, ca *CA, id Identity, ttl time.Duration) issued {
	t.Helper()
	return issueAt(t, ca, id, ttl, t0())
}

func issueAt(t testing.TB, ca *CA, id Identity, ttl time.Duration, now time.Time) issued {
	t.Helper()
	key, csr, err := NewKeyAndCSR("agent")
	if err != nil {
		t.Fatalf("NewKeyAndCSR: %v", err)
	}
	var der []byte
	switch id.Kind {
	case KindSiteAgent:
		der, err = ca.IssueSiteAgent(csr, id.SiteID, id.AgentID, ttl, now)
	case KindNode:
		der, err = ca.IssueNode(csr, id.NodeID, id.Generation, ttl, now)
	case KindNodeTenant:
		der, err = ca.IssueNodeTenant(csr, id.NodeID, id.TenantID, id.Generation, ttl, now)
	case KindServer:
		certPEM, keyPEM, err2 := ca.IssueServer([]string{"localhost", "127.0.0.1"}, ttl, now)
		if err2 != nil {
			t.Fatalf("IssueServer: %v", err2)
		}
		if der, err = DecodeCertPEM(certPEM); err != nil {
			t.Fatalf("DecodeCertPEM: %v", err)
		}
		if key, err = ParseKeyPEM(keyPEM); err != nil {
			t.Fatalf("ParseKeyPEM: %v", err)
		}
	default:
		t.Fatalf("issue: kind %v", id.Kind)
	}
	if err != nil {
		t.Fatalf("issuing %s: %v", id, err)
	}
	return issued{key: key, cert: der}
}

// wantErr fails unless err wraps want (nil want: err must be nil).
func wantErr(t testing.TB, err, want error) {
	t.Helper()
	switch {
	case want == nil && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != nil && !errors.Is(err, want):
		t.Fatalf("error = %v, want one wrapping %q", err, want)
	}
}
