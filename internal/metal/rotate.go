package metal

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"math/big"
	"time"

	"bcd/internal/auth"
	"bcd/internal/command"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// RotateResult is what metal.rotateBmcCredential answers.
type RotateResult struct {
	CommandID string
	Version   uint64
	BatchID   string
}

// passwordClasses: BMCs commonly demand upper and lower case, a digit and a symbol; symbols are
// limited to those every Redfish and IPMI implementation we know accepts.
var passwordClasses = []string{"ABCDEFGHJKLMNPQRSTUVWXYZ", "abcdefghijkmnopqrstuvwxyz", "23456789", "-_.+"}

// GeneratePassword returns a random 20-character password with every class present (IPMI 2.0
// allows 20 bytes).
func GeneratePassword() (string, error) {
	const n = 20
	all := ""
	for _, c := range passwordClasses {
		all += c
	}
	pick := func(set string) (byte, error) {
		i, err := rand.Int(rand.Reader, big.NewInt(int64(len(set))))
		if err != nil {
			return 0, err
		}
		return set[i.Int64()], nil
	}
	out := make([]byte, n)
	for i := range out {
		set := all
		if i < len(passwordClasses) {
			set = passwordClasses[i]
		}
		b, err := pick(set)
		if err != nil {
			return "", fmt.Errorf("generating a password: %w", err)
		}
		out[i] = b
	}
	// Shuffle so the classes are not in fixed positions.
	for i := n - 1; i > 0; i-- {
		j, err := rand.Int(rand.Reader, big.NewInt(int64(i+1)))
		if err != nil {
			return "", fmt.Errorf("generating a password: %w", err)
		}
		out[i], out[j.Int64()] = out[j.Int64()], out[i]
	}
	return string(out), nil
}

// RotateBmcCredential starts a two-phase rotation of a node's BMC password: a generated
// password is sealed and a pending credential version refers to it; a bmc.rotate command
// carrying only references goes to a site agent, which receives the value encrypted to its own
// key, applies it, logs in with it and signs the result. Only a site-signed verified result
// makes the version current (the engine decides, see engine.rotation); on failure the old
// credential stays current. Refused while a workflow controls the node or a rotation is pending.
func (s *Service) RotateBmcCredential(ctx context.Context, p auth.Principal, ref, reason string) (RotateResult, error) {
	if err := Require(p, auth.Operate); err != nil {
		return RotateResult{}, err
	}
	if ref == "" {
		return RotateResult{}, invalid("node", "is required: a node id or name")
	}
	if err := ValidReason(reason); err != nil {
		return RotateResult{}, err
	}
	plain, err := GeneratePassword()
	if err != nil {
		return RotateResult{}, err
	}
	var res RotateResult
	err = s.st.Write(ctx, func(tx *store.Tx) error {
		n, err := tx.LockNode(ctx, ref, p.TenantID)
		if err != nil {
			return err
		}
		if PNode(n).Busy() {
			return &ConflictError{Msg: fmt.Sprintf("node %s is %s under a workflow: rotate its BMC credential once it rests", n.Name, n.State)}
		}
		if n.State == string(provision.Retired) {
			return &ConflictError{Msg: fmt.Sprintf("node %s is retired", n.Name)}
		}
		versions, err := tx.CredentialVersionsOf(ctx, n.ID)
		if err != nil {
			return err
		}
		var next uint64 = 1
		if len(versions) == 0 {
			// The credential given at enrollment becomes version 1.
			v1 := store.CredentialVersion{NodeID: n.ID, Version: 1, UsernameRef: n.BMCUsernameRef, PasswordRef: n.BMCPasswordRef, State: store.CredCurrent, DecidedAt: tx.At()}
			if err := tx.InsertCredentialVersion(ctx, &v1); err != nil {
				return err
			}
			next = 2
		} else {
			if versions[0].State == store.CredPending {
				return &ConflictError{Msg: fmt.Sprintf("node %s already has rotation %d pending (command %s)", n.Name, versions[0].Version, versions[0].CommandID)}
			}
			next = versions[0].Version + 1
		}
		passRef, err := s.seal(ctx, tx, n.TenantID, plain)
		if err != nil {
			return err
		}
		kind, _ := command.Lookup("bmc.rotate")
		c := store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: kind.Name, Subject: "bmc:" + n.BMCAddress,
			Args:   jsonObject(map[string]any{"nodeId": n.ID, "bmc": n.BMC(), "newPasswordRef": passRef, "version": next}),
			RunsOn: string(kind.RunsOn), Destructive: kind.Destructive, Attested: kind.Attested, Reroutable: kind.Reroutable,
			Generation: n.IdentityGeneration, Deadline: tx.At() + (10 * time.Minute).Microseconds()}
		if res.BatchID, err = s.directBatch(ctx, tx, p, n, &c, reason); err != nil {
			return err
		}
		if err := tx.InsertCommand(ctx, &c); err != nil {
			return err
		}
		v := store.CredentialVersion{NodeID: n.ID, Version: next, UsernameRef: n.BMCUsernameRef, PasswordRef: passRef, State: store.CredPending, CommandID: c.ID}
		if err := tx.InsertCredentialVersion(ctx, &v); err != nil {
			return err
		}
		res.CommandID, res.Version = c.ID, next
		return tx.AppendEvent(ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: p.Actor(), Kind: "node.bmc.rotate", FromState: n.State, ToState: n.State,
			Reason: reason, Data: jsonObject(map[string]any{"version": next, "command": c.ID, "batch": res.BatchID})})
	})
	if err != nil {
		return RotateResult{}, fmt.Errorf("rotating the BMC credential of %s: %w", ref, err)
	}
	s.woke()
	s.log.LogAttrs(ctx, slog.LevelInfo, "BMC credential rotation queued", slog.String("node", ref), slog.Uint64("version", res.Version), slog.String("actor", p.Actor()))
	return res, nil
}

// CredentialVersions lists a node's BMC credential versions (references only, never values).
func (s *Service) CredentialVersions(ctx context.Context, p auth.Principal, ref string) ([]store.CredentialVersion, error) {
	n, err := s.Get(ctx, p, ref)
	if err != nil {
		return nil, err
	}
	return s.st.CredentialVersions(ctx, n.ID)
}
