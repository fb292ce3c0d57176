package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"bcd/internal/command"
	"bcd/internal/pki"
	"bcd/internal/secrets"
	"bcd/internal/store"
)

// ConditionBMCRotated is the node condition a rotation sets: "True" after a verified one,
// "False" after a failed one.
const ConditionBMCRotated = "BmcCredentialRotated"

// rotateResult is what a site agent reports for bmc.rotate.
type rotateResult struct {
	Verified bool `json:"verified"`
}

// RotationOutcome decides a finished bmc.rotate: nil only for a succeeded command whose result
// a site agent of the node's site signed and which says verified: true. Pure but for the
// signature check it is given.
func RotationOutcome(c store.Command, verifySite func(store.Command) error) error {
	switch command.State(c.State) {
	case command.Succeeded:
	case command.Failed, command.Lost:
		msg := c.Error
		if msg == "" {
			msg = "no reason given"
		}
		return fmt.Errorf("bmc.rotate %s: %s", c.State, msg)
	default:
		return fmt.Errorf("bmc.rotate is %s, not finished", c.State)
	}
	if len(c.ResultSig) == 0 || len(c.SignerCert) == 0 {
		return errors.New("the bmc.rotate result is not signed by a site agent")
	}
	if err := verifySite(c); err != nil {
		return err
	}
	var res rotateResult
	if err := json.Unmarshal([]byte(c.Result), &res); err != nil {
		return fmt.Errorf("the bmc.rotate result is not JSON: %w", err)
	}
	if !res.Verified {
		return errors.New("the site agent did not verify a login with the new credential")
	}
	return nil
}

// verifySiteSigned checks a bmc.rotate result's signature: a site agent of the command's site.
func (e *Engine) verifySiteSigned(c store.Command) error {
	if e.ca == nil {
		return errors.New("no CA configured to verify site-signed results")
	}
	return pki.VerifySiteStatement(e.ca, c.SignerCert, RecordedStatement(c), c.ResultSig, c.SiteID, receivedAt(c))
}

// rotation applies the outcome of the node's pending BMC credential rotation once its command
// finished: verified → the version becomes current, the node's references are rewritten, the
// condition is True and superseded secrets no open command names are deleted; otherwise the
// old credential stays current, the failed version keeps its secret and the condition is False.
func (r *run) rotation() error {
	v, ok, err := r.tx.PendingCredentialVersion(r.ctx, r.n.ID)
	if err != nil || !ok {
		return err
	}
	c, err := r.command(v.CommandID)
	if err != nil {
		return err
	}
	if c.State == "held" || !command.State(c.State).Final() {
		return nil
	}
	n := &r.n
	if n.Conditions == nil {
		n.Conditions = map[string]string{}
	}
	v.DecidedAt = r.tx.At()
	if oerr := RotationOutcome(c, r.e.verifySiteSigned); oerr != nil {
		v.State, v.Error = store.CredFailed, truncate(oerr.Error(), 1000)
		if err := r.tx.UpdateCredentialVersion(r.ctx, &v); err != nil {
			return err
		}
		n.Conditions[ConditionBMCRotated] = "False"
		if err := r.tx.UpdateNode(r.ctx, n); err != nil {
			return err
		}
		return r.event("node.bmc.rotate.failed", n.State, n.State, v.Error, map[string]any{"version": v.Version, "command": c.ID})
	}
	versions, err := r.tx.CredentialVersionsOf(r.ctx, n.ID)
	if err != nil {
		return err
	}
	for _, old := range versions {
		if old.State == store.CredCurrent {
			old.State, old.DecidedAt = store.CredSuperseded, r.tx.At()
			if err := r.tx.UpdateCredentialVersion(r.ctx, &old); err != nil {
				return err
			}
		}
	}
	v.State = store.CredCurrent
	if err := r.tx.UpdateCredentialVersion(r.ctx, &v); err != nil {
		return err
	}
	n.BMCUsernameRef, n.BMCPasswordRef = v.UsernameRef, v.PasswordRef
	n.Conditions[ConditionBMCRotated] = "True"
	if err := r.tx.UpdateNode(r.ctx, n); err != nil {
		return err
	}
	if err := r.event("node.bmc.rotate.verified", n.State, n.State, "", map[string]any{"version": v.Version, "command": c.ID}); err != nil {
		return err
	}
	_, err = PurgeSupersededSecrets(r.ctx, r.tx, 100)
	return err
}

// PurgeSupersededSecrets deletes the password secrets of superseded credential versions that no
// unfinished command names any more (a queued BMC command built before the rotation still opens
// the old one). It returns how many were deleted.
func PurgeSupersededSecrets(ctx context.Context, tx *store.Tx, limit int) (int, error) {
	olds, err := tx.SupersededWithSecrets(ctx, limit)
	if err != nil {
		return 0, err
	}
	deleted := 0
	for _, v := range olds {
		open, err := tx.OpenCommandsNaming(ctx, v.NodeID, v.PasswordRef)
		if err != nil {
			return deleted, err
		}
		if open > 0 {
			continue
		}
		id, err := secrets.ParseRef(v.PasswordRef)
		if err != nil {
			return deleted, err
		}
		if err := tx.DeleteSecret(ctx, id); err != nil {
			return deleted, err
		}
		v.PasswordRef = ""
		if err := tx.UpdateCredentialVersion(ctx, &v); err != nil {
			return deleted, err
		}
		deleted++
	}
	return deleted, nil
}
