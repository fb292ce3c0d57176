package metal

import (
	"context"
	"fmt"
	"log/slog"

	"bcd/internal/auth"
	"bcd/internal/store"
)

// ConfirmMAC is metal.confirmMac: an operator confirms the candidate MAC a node enrolled with a
// product UUID and no MAC was seen PXE-booting with (DESIGN §6 Discovery). The MAC is bound to
// the node and its workflow goes on (boot entry, power cycle, ramdisk). Only the candidate of
// the node's running workflow can be confirmed.
func (s *Service) ConfirmMAC(ctx context.Context, p auth.Principal, ref, mac, reason string) (store.Node, error) {
	if err := Require(p, auth.Operate); err != nil {
		return store.Node{}, err
	}
	if ref == "" {
		return store.Node{}, invalid("node", "is required: a node id or name")
	}
	mac, err := NormalizeMAC("mac", mac)
	if err != nil {
		return store.Node{}, err
	}
	if err := ValidReason(reason); err != nil {
		return store.Node{}, err
	}
	var n store.Node
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		var err error
		if n, err = tx.LockNode(ctx, ref, p.TenantID); err != nil {
			return err
		}
		if len(n.MACs) > 0 {
			return invalid("node", "%s already has MACs %v: there is no candidate to confirm", n.Name, n.MACs)
		}
		cand, ok, err := tx.MACCandidate(ctx, n.ID)
		if err != nil {
			return err
		}
		wf, open, err := tx.OpenWorkflow(ctx, n.ID)
		if err != nil {
			return err
		}
		if !ok || cand.State != store.CandidatePending || !open || wf.ID != cand.WorkflowID || wf.State != "running" {
			return invalid("node", "%s has no MAC candidate waiting for confirmation (one appears after its workflow power-cycled it into PXE and a MAC booted under its product UUID)", n.Name)
		}
		if cand.MAC != mac {
			return invalid("mac", "%s is not the candidate of %s: the candidate is %s", mac, n.Name, cand.MAC)
		}
		if err := tx.AddNodeMAC(ctx, &n, mac); err != nil {
			return err
		}
		cand.State, cand.DecidedBy, cand.DecidedAt = store.CandidateConfirmed, p.Actor(), tx.At()
		if err := tx.PutMACCandidate(ctx, cand); err != nil {
			return err
		}
		if err := tx.AppendEvent(ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: p.Actor(), Kind: "node.mac.confirmed",
			FromState: n.State, ToState: n.State, Reason: reason, Data: jsonObject(map[string]any{"mac": mac, "productUuid": n.ProductUUID, "workflow": wf.ID})}); err != nil {
			return err
		}
		return tx.Wake(ctx, n.ID, "confirmMac", 0)
	})
	if err != nil {
		return store.Node{}, fmt.Errorf("confirm-mac %s %s: %w", ref, mac, err)
	}
	s.woke()
	s.log.LogAttrs(ctx, slog.LevelInfo, "MAC confirmed", slog.String("node", n.ID), slog.String("mac", mac), slog.String("actor", p.Actor()))
	return n, nil
}

// MACCandidates lists the MAC candidates at a site (state "" for all, or pending, confirmed,
// bound, expired), newest first.
func (s *Service) MACCandidates(ctx context.Context, p auth.Principal, siteRef, state string) ([]store.MACCandidate, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	switch state {
	case "", store.CandidatePending, store.CandidateConfirmed, store.CandidateBound, store.CandidateExpired:
	default:
		return nil, invalid("state", "%q: accepted are pending, confirmed, bound, expired (or empty for all)", state)
	}
	site, err := s.st.Site(ctx, siteRef)
	if err != nil || !p.CanSeeTenant(site.TenantID) {
		return nil, fmt.Errorf("site %q: %w", siteRef, store.ErrNotFound)
	}
	return s.st.MACCandidates(ctx, site.ID, state)
}
