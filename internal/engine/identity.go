package engine

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
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

// Certificate lifetimes.
const (
	siteCertTTL = 90 * 24 * time.Hour
	nodeCertTTL = 7 * 24 * time.Hour
)

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
	err = e.st.Write(ctx, func(tx *store.Tx) error {
		jt, err := tx.UseJoinToken(ctx, pki.HashToken(token), "site", csrKeyHash(csrDER), joinRetryWindow)
		if err != nil {
			return err
		}
		agentID := store.NewID(time.Now())
		certDER, err = e.ca.IssueSiteAgent(csrDER, jt.SiteID, agentID, siteCertTTL, time.Now())
		if err != nil {
			return err
		}
		return tx.AppendEvent(ctx, store.Event{Actor: "gateway", Kind: "site.agent.join", Data: fmt.Sprintf(`{"site":%q,"agent":%q}`, jt.SiteID, agentID)})
	})
	return certDER, err
}

// JoinNode consumes a node's one-time token (discovery token of its boot entry: kind "node";
// instance token of the installed OS: kind "os") and certifies the key for the node's current
// identity generation. A token minted for an older generation is refused.
func (e *Engine) JoinNode(ctx context.Context, token string, csrDER []byte, kind string) (certDER []byte, nodeID string, gen uint64, err error) {
	if kind != "node" && kind != "os" {
		return nil, "", 0, fmt.Errorf("node join kind %q: accepted are node and os", kind)
	}
	// Signing the certificate is the join's costly part: it is done before the write
	// transaction, for the node and generation the token names, and used only when the
	// transaction finds the same (else it signs again inside).
	hash := pki.HashToken(token)
	var preCert []byte
	preNode, preGen, err := e.st.JoinTokenNode(ctx, hash)
	if err == nil && preNode != "" {
		preCert, _ = e.ca.IssueNode(csrDER, preNode, preGen, nodeCertTTL, time.Now())
	}
	err = e.st.Write(ctx, func(tx *store.Tx) error {
		jt, err := tx.UseJoinToken(ctx, hash, kind, csrKeyHash(csrDER), joinRetryWindow)
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
		if preCert != nil && preNode == n.ID && preGen == n.IdentityGeneration {
			certDER = preCert
		} else if certDER, err = e.ca.IssueNode(csrDER, n.ID, n.IdentityGeneration, nodeCertTTL, time.Now()); err != nil {
			return err
		}
		nodeID, gen = n.ID, n.IdentityGeneration
		return tx.AppendEvent(ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: "gateway", Kind: "node.join",
			FromState: n.State, ToState: n.State, Data: fmt.Sprintf(`{"kind":%q,"generation":%d}`, kind, gen)})
	})
	return certDER, nodeID, gen, err
}

// CurrentGeneration is the node's identity generation; certificates of older ones are refused.
func (e *Engine) CurrentGeneration(ctx context.Context, nodeID string) (uint64, error) {
	n, err := e.st.Node(ctx, nodeID, "")
	if errors.Is(err, store.ErrNotFound) {
		return 0, fmt.Errorf("node %s: %w", nodeID, err)
	}
	return n.IdentityGeneration, err
}
