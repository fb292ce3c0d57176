package metal

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"bcd/internal/auth"
	"bcd/internal/pki"
	"bcd/internal/store"
)

// AgentCARotation is the installation's agent CA and its rotation as bcd ca and bcd doctor
// show it: the CAs (certificates only: keys never leave the store sealed) and the connected
// agents holding the current stage back.
type AgentCARotation struct {
	Rotation pki.Rotation
	Lagging  []CALag
}

// CALag is a connected agent that holds a rotation's stage back, and why.
type CALag struct {
	Agent  store.AgentCATrust
	Reason string
}

// Reasons an agent holds a rotation back (CALag.Reason).
const (
	lagUnreported  = "never reported the CAs it trusts (an agent older than CA rotation: upgrade it)"
	lagNoNext      = "does not trust the next CA yet (it fetches it at its next heartbeat)"
	lagPreviousCrt = "connected with a certificate of the previous CA (it renews at its next heartbeat)"
)

// caLagging lists the connected agents that hold rotation r's stage back at now (microseconds):
// staged, those not trusting the next CA (they would reject the servers' certificates once it
// signs them); overlap, those connected with a still valid certificate of the previous CA
// (they would be refused once it is no longer trusted). Pure.
func caLagging(r pki.Rotation, agents []store.AgentCATrust, now int64) []CALag {
	var out []CALag
	for _, a := range agents {
		switch r.Stage() {
		case pki.StageStaged:
			switch {
			case !a.Reported:
				out = append(out, CALag{a, lagUnreported})
			case !a.Holds(pki.Fingerprint(r.Next.Raw)):
				out = append(out, CALag{a, lagNoNext})
			}
		case pki.StageOverlap:
			switch {
			case !a.Reported:
				out = append(out, CALag{a, lagUnreported})
			case a.CertIssuer == pki.Fingerprint(r.Previous.Raw) && (a.CertNotAfter == 0 || a.CertNotAfter > now):
				out = append(out, CALag{a, lagPreviousCrt})
			}
		}
	}
	return out
}

// rotationOf parses the stored CA row's certificates.
func rotationOf(ca store.InstallationCA) (pki.Rotation, error) {
	var r pki.Rotation
	parse := func(what, p string) (*x509.Certificate, error) {
		if p == "" {
			return nil, nil
		}
		c, _, err := pki.ParseCACertPEM([]byte(p))
		if err != nil {
			return nil, fmt.Errorf("the installation's %s agent CA: %w", what, err)
		}
		return c, nil
	}
	var err error
	if r.Active, err = parse("active", ca.CertPEM); err != nil {
		return r, err
	}
	if r.Next, err = parse("next", ca.NextCertPEM); err != nil {
		return r, err
	}
	r.Previous, err = parse("previous", ca.PreviousCertPEM)
	return r, err
}

// AgentCA shows the agent CA and its rotation. Admin token without a tenant.
func (s *Service) AgentCA(ctx context.Context, p auth.Principal) (AgentCARotation, error) {
	if err := installationWide(p, "the agent CA and its rotation"); err != nil {
		return AgentCARotation{}, err
	}
	return s.agentCA(ctx)
}

// AgentCAStatus is AgentCA for bcd doctor: ok is false for a principal that may not see it.
func (s *Service) AgentCAStatus(ctx context.Context, p auth.Principal) (_ AgentCARotation, ok bool, err error) {
	if Require(p, auth.Administer) != nil || p.TenantID != "" {
		return AgentCARotation{}, false, nil
	}
	r, err := s.agentCA(ctx)
	if errors.Is(err, store.ErrNotFound) {
		return AgentCARotation{}, false, nil // no server started on this store yet
	}
	return r, err == nil, err
}

func (s *Service) agentCA(ctx context.Context) (AgentCARotation, error) {
	row, ok, err := s.st.InstallationCA(ctx)
	if err != nil {
		return AgentCARotation{}, err
	}
	if !ok {
		return AgentCARotation{}, fmt.Errorf("the installation's agent CA: %w (a server stores it at its first start)", store.ErrNotFound)
	}
	r, err := rotationOf(row)
	if err != nil {
		return AgentCARotation{}, err
	}
	out := AgentCARotation{Rotation: r}
	if r.Stage() != pki.StageSteady {
		agents, err := s.st.ConnectedAgentsCATrust(ctx)
		if err != nil {
			return AgentCARotation{}, err
		}
		out.Lagging = caLagging(r, agents, time.Now().UnixMicro())
	}
	return out, nil
}

// RotateAgentCA stages a new agent CA beside the active one: every server trusts it and hands
// it out with the active one (joins, renewals, heartbeats), and it signs nothing until
// ActivateAgentCA. Refused while a rotation is in progress. Admin token without a tenant.
func (s *Service) RotateAgentCA(ctx context.Context, p auth.Principal, reason string) (AgentCARotation, error) {
	if err := s.caVerb(p, reason); err != nil {
		return AgentCARotation{}, err
	}
	now := time.Now()
	next, err := pki.CreateCA("bcd CA "+now.UTC().Format("2006-01-02 15:04:05Z"), now)
	if err != nil {
		return AgentCARotation{}, err
	}
	keyPEM, err := next.KeyPEM()
	if err != nil {
		return AgentCARotation{}, err
	}
	sealed, err := s.sealer.Seal(store.CASealID, keyPEM)
	if err != nil {
		return AgentCARotation{}, fmt.Errorf("sealing the new agent CA's key: %w", err)
	}
	return s.changeAgentCA(ctx, p, reason, "control_plane.ca_rotated", false, func(row store.InstallationCA, r pki.Rotation, _ []CALag) (store.InstallationCA, error) {
		if st := r.Stage(); st != pki.StageSteady {
			return row, &ConflictError{Msg: fmt.Sprintf("rotating the agent CA: a rotation is in progress (stage %s): %s first", st, nextVerb(st))}
		}
		row.NextCertPEM, row.NextSealedKey = string(next.CertPEM()), sealed
		return row, nil
	})
}

// ActivateAgentCA makes the staged CA the signer of agents' and servers' certificates; the one
// it replaces stays trusted (previous) until FinishAgentCA. Refused while connected agents do
// not trust the new CA (they would reject the servers' new certificates), naming them, unless
// force. The CA it replaces signs, this once and last, the new CA cross-signed (stored after
// the previous CA's certificate, crossSigned): every server presents it after its own
// certificate until FinishAgentCA, so that agents away since before the rotation, holding only
// the previous CA, still verify the servers, come back and are handed the new CA. Admin token
// without a tenant.
func (s *Service) ActivateAgentCA(ctx context.Context, p auth.Principal, reason string, force bool) (AgentCARotation, error) {
	if err := s.caVerb(p, reason); err != nil {
		return AgentCARotation{}, err
	}
	return s.changeAgentCA(ctx, p, reason, "control_plane.ca_activated", force, func(row store.InstallationCA, r pki.Rotation, lag []CALag) (store.InstallationCA, error) {
		if st := r.Stage(); st != pki.StageStaged {
			return row, &ConflictError{Msg: fmt.Sprintf("activating the next agent CA: none is staged (stage %s): %s", st, nextVerb(st))}
		}
		if len(lag) > 0 && !force {
			return row, &ConflictError{Msg: fmt.Sprintf("activating the next agent CA: %s: they would reject the servers' certificates once it signs them; wait for them to fetch it (bcd doctor lists them), or pass --force (they must then join again)", lagList(lag, "connected agent does not trust it", "connected agents do not trust it"))}
		}
		cross, err := s.crossSigned(row)
		if err != nil {
			return row, err
		}
		row.CertPEM, row.SealedKey, row.PreviousCertPEM = row.NextCertPEM, row.NextSealedKey, row.CertPEM+string(cross)
		row.NextCertPEM, row.NextSealedKey = "", nil
		return row, nil
	})
}

// crossSigned is the staged CA of row cross-signed by its active CA (pki.CrossSign), whose key
// is opened for this signature alone: the activation drops the sealed key from the row, as
// before, and nothing else of it is kept.
func (s *Service) crossSigned(row store.InstallationCA) ([]byte, error) {
	keyPEM, err := s.sealer.Open(store.CASealID, row.SealedKey)
	if err != nil {
		return nil, fmt.Errorf("activating the next agent CA: opening the active CA's key to cross-sign the next one: %w", err)
	}
	defer clear(keyPEM)
	prev, err := pki.LoadCA([]byte(row.CertPEM), keyPEM)
	if err != nil {
		return nil, fmt.Errorf("activating the next agent CA: %w", err)
	}
	cross, err := prev.CrossSign([]byte(row.NextCertPEM))
	if err != nil {
		return nil, fmt.Errorf("activating the next agent CA: %w", err)
	}
	return cross, nil
}

// FinishAgentCA ends a rotation: the previous CA is no longer trusted, and certificates it
// issued are refused (at connection, and on open streams at the gateway's next check). Refused
// while agents are connected with certificates of it, naming them, unless force. Admin token
// without a tenant.
func (s *Service) FinishAgentCA(ctx context.Context, p auth.Principal, reason string, force bool) (AgentCARotation, error) {
	if err := s.caVerb(p, reason); err != nil {
		return AgentCARotation{}, err
	}
	return s.changeAgentCA(ctx, p, reason, "control_plane.ca_finished", force, func(row store.InstallationCA, r pki.Rotation, lag []CALag) (store.InstallationCA, error) {
		if st := r.Stage(); st != pki.StageOverlap {
			return row, &ConflictError{Msg: fmt.Sprintf("finishing the agent CA's rotation: no previous CA is trusted (stage %s): %s", st, nextVerb(st))}
		}
		if len(lag) > 0 && !force {
			return row, &ConflictError{Msg: fmt.Sprintf("finishing the agent CA's rotation: %s: they would be refused; wait for them to renew (bcd doctor lists them), or pass --force (they must then join again)", lagList(lag, "connected agent still uses a certificate of the previous CA", "connected agents still use certificates of the previous CA"))}
		}
		// Kept for audits, with when it was retired: the results it certified before (wipe
		// proofs) must still verify. RetiredPEM keeps its certificate alone: the active CA
		// cross-signed by it, stored after it, goes with the rotation.
		retired, err := pki.RetiredPEM([]byte(row.PreviousCertPEM), s.now())
		if err != nil {
			return row, err
		}
		row.RetiredPEM += string(retired)
		row.PreviousCertPEM = ""
		return row, nil
	})
}

func (s *Service) caVerb(p auth.Principal, reason string) error {
	if err := installationWide(p, "the agent CA and its rotation"); err != nil {
		return err
	}
	return ValidReason(reason)
}

// nextVerb says what moves a rotation on from stage st.
func nextVerb(st string) string {
	switch st {
	case pki.StageStaged:
		return "bcd ca activate"
	case pki.StageOverlap:
		return "bcd ca finish"
	default:
		return "bcd ca rotate stages a new CA"
	}
}

// lagList names up to 20 lagging agents.
func lagList(lag []CALag, one, many string) string {
	const max = 20
	names := make([]string, 0, min(len(lag), max))
	for i, l := range lag {
		if i == max {
			names = append(names, fmt.Sprintf("and %d more", len(lag)-max))
			break
		}
		names = append(names, fmt.Sprintf("%s (%s)", l.Agent.AgentID, l.Reason))
	}
	what := many
	if len(lag) == 1 {
		what = one
	}
	return fmt.Sprintf("%d %s: %s", len(lag), what, strings.Join(names, "; "))
}

// changeAgentCA applies change to the stored CA row at the version read and records event kind,
// in one write; a change by another server meanwhile is refused (the caller tries again).
func (s *Service) changeAgentCA(ctx context.Context, p auth.Principal, reason, kind string, force bool,
	change func(store.InstallationCA, pki.Rotation, []CALag) (store.InstallationCA, error)) (AgentCARotation, error) {
	agents, err := s.st.ConnectedAgentsCATrust(ctx)
	if err != nil {
		return AgentCARotation{}, err
	}
	var out AgentCARotation
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		row, err := tx.InstallationCA(ctx)
		if err != nil {
			return err
		}
		r, err := rotationOf(row)
		if err != nil {
			return err
		}
		lag := caLagging(r, agents, time.Now().UnixMicro())
		changed, err := change(row, r, lag)
		if err != nil {
			return err
		}
		stored, err := tx.UpdateInstallationCA(ctx, changed)
		if errors.Is(err, store.ErrStale) {
			return &ConflictError{Msg: "the agent CA changed meanwhile (another server or admin): look at it again (bcd ca status)"}
		}
		if err != nil {
			return err
		}
		if out.Rotation, err = rotationOf(stored); err != nil {
			return err
		}
		data := map[string]any{"stage": out.Rotation.Stage(), "active": pki.Fingerprint(out.Rotation.Active.Raw), "version": stored.Version}
		if out.Rotation.Next != nil {
			data["next"] = pki.Fingerprint(out.Rotation.Next.Raw)
		}
		if out.Rotation.Previous != nil {
			data["previous"] = pki.Fingerprint(out.Rotation.Previous.Raw)
		}
		if force && len(lag) > 0 {
			ids := make([]string, 0, len(lag))
			for _, l := range lag {
				ids = append(ids, l.Agent.AgentID)
			}
			data["forced"], data["lagging"] = true, ids
		}
		return tx.AppendEvent(ctx, store.Event{Actor: p.Actor(), Kind: kind, Reason: reason, Data: jsonObject(data)})
	})
	if err != nil {
		return AgentCARotation{}, err
	}
	s.log.Info("agent CA changed", "event", kind, "stage", out.Rotation.Stage(), "active", pki.Fingerprint(out.Rotation.Active.Raw))
	return out, nil
}
