package sim

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"strings"
	"testing"
	"time"

	"bcd/internal/metal"
	"bcd/internal/pki"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestRenewCertificate: the engine certifies an agent's identity and key again for as long as
// the certificate was made to live (at most the lifetime it issues to that kind of agent),
// records it, and refuses a node identity that was revoked (retire bumps the generation) or
// whose node does not exist.
func TestRenewCertificate(t *testing.T) {
	ctx := context.Background()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		h, ids := start(t, st, 1)
		n := rest(t, h, ids)[ids[0]]
		issue := func(id pki.Identity, ttl time.Duration) ([]byte, *ecdsa.PublicKey) {
			key, csr, err := pki.NewKeyAndCSR("agent")
			if err != nil {
				t.Fatal(err)
			}
			var der []byte
			if id.Kind == pki.KindSiteAgent {
				der, err = h.CA.IssueSiteAgent(csr, id.SiteID, id.AgentID, ttl, time.Now())
			} else {
				der, err = h.CA.IssueNode(csr, id.NodeID, id.Generation, ttl, time.Now())
			}
			if err != nil {
				t.Fatal(err)
			}
			return der, key.Public().(*ecdsa.PublicKey)
		}
		const day = 24 * time.Hour
		node := pki.NodeIdentity(n.ID, n.IdentityGeneration)
		for _, tc := range []struct {
			name     string
			id       pki.Identity
			lifetime time.Duration
			want     time.Duration // the renewed certificate's lifetime
		}{
			{"ramdisk", node, 7 * day, 7 * day},
			{"short-lived", node, 2 * time.Hour, 2 * time.Hour},
			{"node, longer than any node certificate", node, 365 * day, 90 * day},
			{"site agent", pki.SiteAgentIdentity(h.SiteID, "a1"), 90 * day, 90 * day},
			{"site agent, longer than a site certificate", pki.SiteAgentIdentity(h.SiteID, "a1"), 365 * day, 90 * day},
		} {
			t.Run(tc.name, func(t *testing.T) {
				der, pub := issue(tc.id, tc.lifetime)
				got, err := h.Engine.RenewCertificate(ctx, der)
				if err != nil {
					t.Fatal(err)
				}
				c, id, err := h.CA.Verify(got, time.Now())
				if err != nil || id != tc.id || !pub.Equal(c.PublicKey) {
					t.Fatalf("renewed %s (%v), want %s with the same key", id, err, tc.id)
				}
				if life := pki.Lifetime(c.NotBefore, c.NotAfter); life != tc.want {
					t.Fatalf("renewed for %s, want %s", life, tc.want)
				}
			})
		}
		evs, err := st.Events(ctx, store.EventFilter{Limit: 10000})
		if err != nil {
			t.Fatal(err)
		}
		var nodeRenewals, siteRenewals int
		for _, ev := range evs {
			switch {
			case ev.Kind != "agent.cert.renew":
			case ev.NodeID == n.ID && strings.Contains(ev.Data, node.URI()):
				nodeRenewals++
			case ev.NodeID == "" && strings.Contains(ev.Data, "site-agent"):
				siteRenewals++
			}
		}
		if nodeRenewals != 3 || siteRenewals != 2 {
			t.Fatalf("agent.cert.renew events: %d of the node, %d of the site agent; want 3 and 2", nodeRenewals, siteRenewals)
		}

		// Retiring the node revokes its identity: its certificates are no longer renewed.
		der, _ := issue(node, 7*day)
		if _, _, err := h.Metal.Apply(ctx, h.Admin, provision.VerbRetire, metal.VerbInput{Node: ids[0]}); err != nil {
			t.Fatal(err)
		}
		h.Engine.Nudge()
		if got := rest(t, h, ids)[ids[0]]; got.State != "retired" || got.IdentityGeneration == n.IdentityGeneration {
			t.Fatalf("after retire: %s at generation %d", got.State, got.IdentityGeneration)
		}
		if got, err := h.Engine.RenewCertificate(ctx, der); !errors.Is(err, pki.ErrIdentityRevoked) || got != nil {
			t.Fatalf("renewing a revoked identity: %v", err)
		}
		der, _ = issue(pki.NodeIdentity("no-such-node", 1), 7*day)
		if _, err := h.Engine.RenewCertificate(ctx, der); !errors.Is(err, pki.ErrIdentityRevoked) {
			t.Fatalf("renewing an unknown node's certificate: %v", err)
		}
		// A certificate of another CA is refused before anything is written.
		other, err := pki.CreateCA("other", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		_, csr, _ := pki.NewKeyAndCSR("x")
		foreign, _ := other.IssueSiteAgent(csr, h.SiteID, "a1", day, time.Now())
		if _, err := h.Engine.RenewCertificate(ctx, foreign); !errors.Is(err, pki.ErrUnknownCA) {
			t.Fatalf("renewing another CA's certificate: %v", err)
		}
	})
}

// TestJoinIdentities: a ramdisk (discovery token) gets the node's platform identity, which
// attests; the installed OS (instance token), which its lessee controls, gets a node-tenant
// certificate naming the node's tenant, which never attests — and keeps it when renewed.
func TestJoinIdentities(t *testing.T) {
	ctx := context.Background()
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		h, ids := start(t, st, 1)
		n := rest(t, h, ids)[ids[0]]
		for _, tc := range []struct {
			kind, prefix string
			want         pki.Identity
		}{
			{"node", pki.DiscoveryTokenPrefix, pki.NodeIdentity(n.ID, n.IdentityGeneration)},
			{"os", pki.InstanceTokenPrefix, pki.NodeTenantIdentity(n.ID, n.TenantID, n.IdentityGeneration)},
		} {
			t.Run(tc.kind, func(t *testing.T) {
				plain, hash, err := pki.NewToken(tc.prefix)
				if err != nil {
					t.Fatal(err)
				}
				if err := st.Write(ctx, func(tx *store.Tx) error {
					return tx.InsertJoinToken(ctx, store.JoinToken{Hash: hash, Kind: tc.kind, SiteID: h.SiteID, NodeID: n.ID, CommandID: "test-" + tc.kind,
						Generation: n.IdentityGeneration, ExpiresAt: tx.At() + time.Hour.Microseconds()})
				}); err != nil {
					t.Fatal(err)
				}
				_, csr, err := pki.NewKeyAndCSR("agent")
				if err != nil {
					t.Fatal(err)
				}
				der, nodeID, _, err := h.Engine.JoinNode(ctx, plain, csr, tc.kind)
				if err != nil || nodeID != n.ID {
					t.Fatalf("join: node %q, %v", nodeID, err)
				}
				_, id, err := h.CA.Verify(der, time.Now())
				if err != nil || id != tc.want {
					t.Fatalf("joined as %s (%v), want %s", id, err, tc.want)
				}
				if id.CanAttest() != (tc.kind == "node") {
					t.Fatalf("%s certificate: can attest %v", tc.kind, id.CanAttest())
				}
				renewed, err := h.Engine.RenewCertificate(ctx, der)
				if err != nil {
					t.Fatal(err)
				}
				if _, id, err := h.CA.Verify(renewed, time.Now()); err != nil || id != tc.want {
					t.Fatalf("renewed as %s (%v), want %s", id, err, tc.want)
				}
			})
		}
	})
}

// TestReleaseRevokesTheLeasesIdentities: a release begins by revoking the node's identity, so a
// node certificate from the lease (the deploy ramdisk's key, which the kexec leaves in the
// lessee's memory) can neither be renewed nor sign the release's wipe, which is made for the new
// generation.
func TestReleaseRevokesTheLeasesIdentities(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	h, ids := start(t, st, 1)
	rest(t, h, ids)
	h.Apply(ctx, provision.VerbDeploy, ids, metal.VerbInput{Image: "img"})
	leased := rest(t, h, ids)[ids[0]]
	if leased.State != "deployed" {
		t.Fatalf("deploy: %s %s", leased.State, leased.FaultMsg)
	}
	key, csr, err := pki.NewKeyAndCSR("deploy ramdisk")
	if err != nil {
		t.Fatal(err)
	}
	kept, err := h.CA.IssueNode(csr, leased.ID, leased.IdentityGeneration, 7*24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	h.Apply(ctx, provision.VerbUndeploy, ids, metal.VerbInput{})
	released := rest(t, h, ids)[ids[0]]
	if released.State != "ready" || released.IdentityGeneration <= leased.IdentityGeneration {
		t.Fatalf("after the release: %s at generation %d (deployed at %d)", released.State, released.IdentityGeneration, leased.IdentityGeneration)
	}
	if _, err := h.Engine.RenewCertificate(ctx, kept); !errors.Is(err, pki.ErrIdentityRevoked) {
		t.Fatalf("renewing the lease's node certificate: %v", err)
	}
	cmds, err := st.Commands(ctx, ids[0], 500)
	if err != nil {
		t.Fatal(err)
	}
	var wipe store.Command
	for _, c := range cmds {
		if c.Kind == "disk.wipe" && c.State == "succeeded" {
			wipe = c // the last one: the release's
		}
	}
	if wipe.Generation != released.IdentityGeneration {
		t.Fatalf("the release's wipe was made for generation %d, the node is at %d", wipe.Generation, released.IdentityGeneration)
	}
	// The kept key signs the wipe's statement: it does not verify for the node now.
	st0 := pki.Statement{CommandID: wipe.ID, NodeID: wipe.NodeID, Kind: wipe.Kind, Generation: leased.IdentityGeneration, ResultSHA256: pki.ResultDigest([]byte(wipe.Result))}
	sig, err := pki.SignStatement(key, st0)
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.VerifyStatement(h.CA, kept, st0, sig, released.IdentityGeneration, time.Now()); !errors.Is(err, pki.ErrIdentityRevoked) {
		t.Fatalf("a wipe signed with the lease's key: %v", err)
	}
}
