package engine

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"bcd/internal/pki"
	"bcd/internal/store"
)

// joinRetryWindow is how long the key that used a one-time token may use it again (its first
// answer may have been lost with a crashed server).
const joinRetryWindow = 10 * time.Minute

// csrKeyHash identifies the key of a CSR (empty when the CSR does not parse; issuance then
// refuses it anyway).
func csrKeyHash(csrDER []byte) []byte {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil
	}
	h := sha256.Sum256(csr.RawSubjectPublicKeyInfo)
	return h[:]
}

// CreateSiteJoinToken mints a one-time, expiring bootstrap token for a site agent of siteID.
func (e *Engine) CreateSiteJoinToken(ctx context.Context, siteID string, ttl time.Duration) (string, error) {
	plain, hash, err := pki.NewToken(pki.JoinTokenPrefix)
	if err != nil {
		return "", err
	}
	err = e.st.Write(ctx, func(tx *store.Tx) error {
		return tx.InsertJoinToken(ctx, store.JoinToken{Hash: hash, Kind: "site", SiteID: siteID, ExpiresAt: tx.At() + ttl.Microseconds()})
	})
	if err != nil {
		return "", fmt.Errorf("creating a join token for site %s: %w", siteID, err)
	}
	return plain, nil
}

// JoinSite consumes a site bootstrap token and certifies the agent's key (from its CSR).
func (e *Engine) JoinSite(ctx context.Context, token string, csrDER []byte) (certDER []byte, err error) {
	keyHash := csrKeyHash(csrDER) // parsed before the single writer
	err = e.st.Write(ctx, func(tx *store.Tx) error {
		jt, err := tx.UseJoinToken(ctx, pki.HashToken(token), "site", keyHash, joinRetryWindow)
		if err != nil {
			return err
		}
		agentID := store.NewID(time.Now())
		certDER, err = e.ca.IssueSiteAgent(csrDER, jt.SiteID, agentID, e.cfg.SiteCertTTL, time.Now())
		if err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{Actor: "gateway", Kind: "site.agent.join", Data: fmt.Sprintf(`{"site":%q,"agent":%q}`, jt.SiteID, agentID)})
	})
	return certDER, err
}

// JoinNode consumes a node's one-time token (discovery token of its boot entry: kind "node";
// instance token of the installed OS: kind "os") and certifies the key for the node's current
// identity generation. A token minted for an older generation is refused. The ramdisk gets the
// node's platform identity (a node certificate: it attests wipes); the installed OS, which its
// lessee controls, gets a node-tenant certificate, which never attests and never counts as the
// node's ramdisk.
func (e *Engine) JoinNode(ctx context.Context, token string, csrDER []byte, kind string) (certDER []byte, nodeID string, gen uint64, err error) {
	if kind != "node" && kind != "os" {
		return nil, "", 0, fmt.Errorf("node join kind %q: accepted are node and os", kind)
	}
	ttl := e.cfg.NodeCertTTL
	if kind == "os" {
		ttl = e.cfg.OSCertTTL
	}
	issue := func(nodeID, tenantID string, gen uint64) ([]byte, error) {
		if kind == "os" {
			return e.ca.IssueNodeTenant(csrDER, nodeID, tenantID, gen, ttl, time.Now())
		}
		return e.ca.IssueNode(csrDER, nodeID, gen, ttl, time.Now())
	}
	// Signing the certificate is the join's costly part: it is done before the write
	// transaction, for the node, tenant and generation the token names, and used only when the
	// transaction finds the same (else it signs again inside).
	hash := pki.HashToken(token)
	var preCert []byte
	var preNode, preTenant string
	var preGen uint64
	if t, ok := e.joinTokens.Get(string(hash)); ok {
		// Handed out by this server: whom it names is known without a read beside the
		// writer (see Report).
		preNode, preTenant, preGen = t.node, t.tenant, t.gen
		defer e.joinTokens.Delete(string(hash))
	} else {
		preNode, preTenant, preGen, err = e.st.JoinTokenNode(ctx, hash)
	}
	if err == nil && preNode != "" {
		if err := e.cpu.run(ctx, func() { preCert, _ = issue(preNode, preTenant, preGen) }); err != nil {
			return nil, "", 0, err
		}
	}
	keyHash := csrKeyHash(csrDER) // parsed before the single writer
	err = e.st.Write(ctx, func(tx *store.Tx) error {
		jt, err := tx.UseJoinToken(ctx, hash, kind, keyHash, joinRetryWindow)
		if err != nil {
			return err
		}
		n, err := tx.LockNode(ctx, jt.NodeID, "")
		if err != nil {
			return err
		}
		if n.IdentityGeneration != jt.Generation {
			return fmt.Errorf("token of generation %d, node is at %d: %w", jt.Generation, n.IdentityGeneration, store.ErrTokenInvalid)
		}
		if preCert != nil && preNode == n.ID && preTenant == n.TenantID && preGen == n.IdentityGeneration {
			certDER = preCert
		} else if certDER, err = issue(n.ID, n.TenantID, n.IdentityGeneration); err != nil {
			return err
		}
		nodeID, gen = n.ID, n.IdentityGeneration
		return tx.AppendEvent(ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: "gateway", Kind: "node.join",
			FromState: n.State, ToState: n.State, Data: fmt.Sprintf(`{"kind":%q,"generation":%d}`, kind, gen)})
	})
	return certDER, nodeID, gen, err
}

// tokenNode is whom a node join token names: its node, the node's tenant and identity
// generation when the token was made (JoinNode checks them in the writer).
type tokenNode struct {
	node, tenant string
	gen          uint64
}

// maxJoinTokens bounds the join tokens a server remembers having handed out (one per machine
// booting; emptied when full, which only sends those joins' reads beside the writer).
const maxJoinTokens = 1 << 16

// CurrentGeneration is the node's identity generation; certificates of older ones are refused.
func (e *Engine) CurrentGeneration(ctx context.Context, nodeID string) (uint64, error) {
	return e.st.NodeGeneration(ctx, nodeID)
}

// renewTTL is the lifetime of a renewed certificate: that of the one it replaces (lifetime),
// at most the longest the engine issues to that kind of agent. Pure.
func renewTTL(cfg Config, kind pki.Kind, lifetime time.Duration) time.Duration {
	limit := cfg.SiteCertTTL
	if kind != pki.KindSiteAgent {
		limit = max(cfg.NodeCertTTL, cfg.OSCertTTL)
	}
	if lifetime <= 0 || lifetime > limit {
		return limit
	}
	return lifetime
}

// RenewCertificate certifies again the identity and key of certDER, an agent's valid
// certificate (the gateway's Renew), for as long again as it was made to live. A node's
// certificate is renewed only for the node's current identity generation. The renewal is an
// event (agent.cert.renew) with the new certificate's expiry.
func (e *Engine) RenewCertificate(ctx context.Context, certDER []byte) ([]byte, error) {
	cert, id, err := e.ca.Verify(certDER, time.Now())
	if err != nil {
		return nil, fmt.Errorf("renewing an agent certificate: %w", err)
	}
	ttl := renewTTL(e.cfg, id.Kind, pki.Lifetime(cert.NotBefore, cert.NotAfter))
	var der []byte
	err = e.st.Write(ctx, func(tx *store.Tx) error {
		ev := store.Event{Actor: "gateway", Kind: "agent.cert.renew"}
		if id.Kind != pki.KindSiteAgent {
			n, err := tx.LockNode(ctx, id.NodeID, "")
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("node %s: %w", id.NodeID, pki.ErrIdentityRevoked)
			}
			if err != nil {
				return err
			}
			if n.IdentityGeneration != id.Generation {
				return fmt.Errorf("generation %d, node is at %d: %w", id.Generation, n.IdentityGeneration, pki.ErrIdentityRevoked)
			}
			ev.TenantID, ev.NodeID, ev.FromState, ev.ToState = n.TenantID, n.ID, n.State, n.State
		}
		if der, err = e.ca.Renew(certDER, ttl, time.Now()); err != nil {
			return err
		}
		renewed, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("reading the renewed certificate: %w", err)
		}
		ev.Data = fmt.Sprintf(`{"agent":%q,"notAfter":%q}`, id.URI(), renewed.NotAfter.UTC().Format(time.RFC3339))
		if id.Kind == pki.KindSiteAgent {
			renewAt, notAfter := certTimes(renewed)
			if err := tx.AgentCertificate(ctx, id.AgentID, renewAt, notAfter); err != nil {
				return err
			}
		}
		return tx.AppendEvent(ctx, ev)
	})
	if err != nil {
		return nil, fmt.Errorf("renewing %s's certificate: %w", id, err)
	}
	return der, nil
}

// certTimes are when certificate c is due for renewal and when it expires (microseconds).
func certTimes(c *x509.Certificate) (renewAt, notAfter int64) {
	return pki.RenewAt(c.NotBefore, c.NotAfter).UnixMicro(), c.NotAfter.UnixMicro()
}

// connectedCert is what a connecting agent's DER certificate tells, parsed once: certTimes, and
// key, the hex SHA-256 of its public key. Zeros and "" for none (in-process agents may have
// none) or for one that does not parse.
func connectedCert(certDER []byte) (renewAt, notAfter int64, key string) {
	if len(certDER) == 0 {
		return 0, 0, ""
	}
	c, err := x509.ParseCertificate(certDER)
	if err != nil {
		return 0, 0, ""
	}
	renewAt, notAfter = certTimes(c)
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return renewAt, notAfter, hex.EncodeToString(sum[:])
}
