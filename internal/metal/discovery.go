package metal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"

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
	if siteRef == "" {
		return nil, invalid("site", "is required: the name or id of the site whose MAC candidates to list")
	}
	site, err := s.st.Site(ctx, siteRef)
	if err != nil || !p.CanSeeTenant(site.TenantID) {
		return nil, fmt.Errorf("site %q: %w", siteRef, store.ErrNotFound)
	}
	return s.st.MACCandidates(ctx, site.ID, state)
}

// ---------------------------------------------------------------- acceptance flow

// Pending lists the machines a discovery-mode ramdisk reported at a site that wait for a
// decision (and those auto-accepted but not enrolled yet).
func (s *Service) Pending(ctx context.Context, p auth.Principal, siteRef string, limit int) ([]store.Discovery, error) {
	if err := Require(p, auth.Read); err != nil {
		return nil, err
	}
	site, err := s.visibleSite(ctx, p, siteRef)
	if err != nil {
		return nil, err
	}
	if limit <= 0 || limit > MaxPageSize {
		limit = 500
	}
	return s.st.Pending(ctx, site.ID, limit)
}

func (s *Service) visibleSite(ctx context.Context, p auth.Principal, ref string) (store.Site, error) {
	if ref == "" {
		return store.Site{}, invalid("site", "is required: the name or id of a site")
	}
	site, err := s.st.Site(ctx, ref)
	if err != nil || !p.CanSeeTenant(site.TenantID) {
		return store.Site{}, fmt.Errorf("site %q: %w", ref, store.ErrNotFound)
	}
	return site, nil
}

// AcceptInput is metal.accept's input: the machine by the MAC it PXE-booted with at a site,
// and what enrollment needs: the BMC credentials from the operator, or BMC.Inband (the node's
// ramdisk provisions a generated credential over the host's IPMI interface).
type AcceptInput struct {
	Site, MAC, Pool, Name string
	BMC                   BMCInput
	Labels                map[string]string
	Reason                string
	BootMode              string // as EnrollInput.BootMode
}

// AcceptDiscovered enrolls a discovered machine: its boot MAC and the product UUID it reported (its
// discovery-mode inventory's, else the one iPXE saw) become the node's; the site's and the
// pool's labels are merged as for every enrollment. The normal chain follows (enroll, inspect:
// the ramdisk's inventory must match). The acceptance is recorded in the enrolment's
// transaction, on the machine as it was read: if another acceptance enrolled it, or someone
// rejected it, since, nothing is enrolled.
func (s *Service) AcceptDiscovered(ctx context.Context, p auth.Principal, in AcceptInput) (store.Node, error) {
	if err := Require(p, auth.Operate); err != nil {
		return store.Node{}, err
	}
	mac, err := NormalizeMAC("mac", in.MAC)
	if err != nil {
		return store.Node{}, err
	}
	site, err := s.visibleSite(ctx, p, in.Site)
	if err != nil {
		return store.Node{}, err
	}
	d, err := s.st.DiscoveryOf(ctx, site.ID, mac)
	if err != nil {
		return store.Node{}, fmt.Errorf("accept %s: %w", mac, err)
	}
	if d.NodeID != "" {
		return store.Node{}, acceptRefused(mac, d)
	}
	if in.Pool != "" {
		pool, err := s.st.Pool(ctx, in.Pool)
		if err == nil && p.CanSeeTenant(pool.TenantID) && pool.SiteID != site.ID {
			return store.Node{}, invalid("pool", "%s is not at site %s, where the machine was seen", pool.Name, site.Name)
		}
	}
	uuid := d.UUID
	if inv := selfAsserted(d.Inventory); inv.SystemUUID != "" {
		uuid = inv.SystemUUID
	}
	var refused error
	record := func(ctx context.Context, tx *store.Tx, n store.Node) error {
		refused = nil // a retried transaction runs this again
		now, ok, err := tx.RecordAcceptance(ctx, site.ID, mac, n.ID, p.Actor(), d.Acceptance)
		if err != nil {
			return err
		}
		if !ok {
			refused = acceptRefused(mac, now)
			return refused
		}
		return tx.AppendEvent(ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: p.Actor(), Kind: "node.accepted", ToState: n.State, Reason: in.Reason,
			Data: jsonObject(map[string]any{"mac": mac, "productUuid": uuid, "site": site.Name, "bmcInband": in.BMC.Inband})})
	}
	n, err := s.Enroll(ctx, p, EnrollInput{Name: in.Name, Pool: in.Pool, BMC: in.BMC, MACs: []string{mac}, ProductUUID: uuid, Labels: in.Labels, Reason: in.Reason, BootMode: in.BootMode,
		accepted: true, record: record})
	if refused != nil && errors.Is(err, refused) {
		return store.Node{}, refused
	}
	if err != nil {
		return store.Node{}, fmt.Errorf("accept %s: %w", mac, err)
	}
	return n, nil
}

// acceptRefused is why an acceptance of mac is refused, d the machine as it is: an acceptance
// enrolled it already, or it was rejected after the acceptance read it.
func acceptRefused(mac string, d store.Discovery) error {
	if d.NodeID != "" {
		return fmt.Errorf("accept %s: it was accepted as node %s already (by %s): %w", mac, d.NodeID, d.DecidedBy, store.ErrConflict)
	}
	return &ConflictError{Msg: fmt.Sprintf("accept %s: %s rejected it while it was being accepted: nothing was enrolled; "+
		"accept it again to override the rejection", mac, d.DecidedBy)}
}

// RejectDiscovered records that a discovered machine is not to be enrolled: it leaves the
// pending list. It is refused once an acceptance enrolled the machine, even one that committed
// while the rejection was on its way.
func (s *Service) RejectDiscovered(ctx context.Context, p auth.Principal, siteRef, mac, reason string) error {
	if err := Require(p, auth.Operate); err != nil {
		return err
	}
	mac, err := NormalizeMAC("mac", mac)
	if err != nil {
		return err
	}
	if err := ValidReason(reason); err != nil {
		return err
	}
	site, err := s.visibleSite(ctx, p, siteRef)
	if err != nil {
		return err
	}
	var refused error
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		refused = nil // a retried transaction runs this again
		now, ok, err := tx.RecordRejection(ctx, site.ID, mac, p.Actor())
		if err != nil {
			return err
		}
		if !ok {
			refused = &ConflictError{Msg: fmt.Sprintf("reject %s: it was accepted as node %s (by %s): delete or retire the node instead", mac, now.NodeID, now.DecidedBy)}
			return refused
		}
		// The decision is audited as an acceptance is (node.accepted): who, why, which machine.
		return tx.AppendEvent(ctx, store.Event{TenantID: site.TenantID, Actor: p.Actor(), Kind: "discovery.rejected", Reason: reason,
			Data: jsonObject(map[string]any{"mac": mac, "site": site.Name})})
	})
	if refused != nil && errors.Is(err, refused) {
		return refused
	}
	if err != nil {
		return fmt.Errorf("reject %s: %w", mac, err)
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "discovered machine rejected", slog.String("site", site.Name), slog.String("mac", mac), slog.String("actor", p.Actor()), slog.String("reason", reason))
	return nil
}

// selfAssertedInventory is what the acceptance flow reads of a discovery-mode ramdisk's report.
type selfAssertedInventory struct {
	SystemUUID string   `json:"systemUuid"`
	MACs       []string `json:"macs"`
}

func selfAsserted(s string) selfAssertedInventory {
	var inv selfAssertedInventory
	if s != "" && json.Unmarshal([]byte(s), &inv) == nil {
		if u, err := NormalizeUUID("systemUuid", inv.SystemUUID); err == nil {
			inv.SystemUUID = u
		} else {
			inv.SystemUUID = ""
		}
	}
	return inv
}

// AutoInbandName is the name of a node a pool's autoAccept enrolled in-band: auto- and the boot
// MAC without colons. Pure.
func AutoInbandName(mac string) string { return "auto-" + strings.ReplaceAll(mac, ":", "") }

// AutoEnrollInband enrolls a machine that its pool's autoAccept just accepted, when the pool's
// policy also says autoAcceptInband: as bcd node accept --inband by the pool (actor
// token:autoAccept:POOL), named AutoInbandName. The engine calls it after recording the
// acceptance (engine.Config.AutoEnroll).
func (s *Service) AutoEnrollInband(ctx context.Context, siteID, mac string, pool store.Pool) error {
	if !pool.Policy.AutoAccept || !pool.Policy.AutoAcceptInband {
		return fmt.Errorf("auto-enrolling %s: pool %s does not auto-accept in-band", mac, pool.Name)
	}
	p := auth.Principal{Name: "autoAccept:" + pool.Name, Role: auth.Operator, TenantID: pool.TenantID}
	n, err := s.AcceptDiscovered(ctx, p, AcceptInput{Site: siteID, MAC: mac, Pool: pool.ID, Name: AutoInbandName(mac), BMC: BMCInput{Inband: true},
		Reason: "pool " + pool.Name + " auto-accepts with an in-band BMC credential"})
	if err != nil {
		return err
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "discovered machine auto-enrolled in-band", slog.String("node", n.ID), slog.String("name", n.Name), slog.String("mac", mac), slog.String("pool", pool.Name))
	return nil
}
