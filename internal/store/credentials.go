package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Credential version states (bmc_credential_versions).
const (
	CredPending    = "pending"    // a bmc.rotate carries it; not used for anything else yet
	CredCurrent    = "current"    // the node's BMC credential
	CredFailed     = "failed"     // the rotation failed; its secret is kept (the BMC may hold it)
	CredSuperseded = "superseded" // replaced by a newer current version
)

// CredentialVersion is one version of a node's BMC credential, by reference.
type CredentialVersion struct {
	ID, NodeID               string
	Version                  uint64
	UsernameRef, PasswordRef string
	State, CommandID, Error  string
	CreatedAt, DecidedAt     int64
}

const credCols = `id, node_id, version, username_ref, password_ref, state, command_id, error, created_at, decided_at`

func scanCred(r interface{ Scan(...any) error }) (CredentialVersion, error) {
	var c CredentialVersion
	var v int64
	err := r.Scan(&c.ID, &c.NodeID, &v, &c.UsernameRef, &c.PasswordRef, &c.State, &c.CommandID, &c.Error, &c.CreatedAt, &c.DecidedAt)
	c.Version = uint64(v)
	return c, err
}

// InsertCredentialVersion adds a version; (node, version) is unique.
func (t *Tx) InsertCredentialVersion(ctx context.Context, c *CredentialVersion) error {
	c.ID = NewID(Micros(t.at))
	c.CreatedAt = t.at
	_, err := t.exec(ctx, `INSERT INTO bmc_credential_versions (`+credCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		c.ID, c.NodeID, int64(c.Version), c.UsernameRef, c.PasswordRef, c.State, c.CommandID, c.Error, c.CreatedAt, c.DecidedAt)
	if err != nil {
		if isUnique(err) {
			return fmt.Errorf("credential version %d of node %s: %w", c.Version, c.NodeID, ErrConflict)
		}
		return fmt.Errorf("inserting credential version of node %s: %w", c.NodeID, err)
	}
	return nil
}

// UpdateCredentialVersion writes a version's state, command, error and refs.
func (t *Tx) UpdateCredentialVersion(ctx context.Context, c *CredentialVersion) error {
	_, err := t.exec(ctx, `UPDATE bmc_credential_versions SET state = ?, command_id = ?, error = ?, decided_at = ?, username_ref = ?, password_ref = ? WHERE id = ?`,
		c.State, c.CommandID, c.Error, c.DecidedAt, c.UsernameRef, c.PasswordRef, c.ID)
	if err != nil {
		return fmt.Errorf("updating credential version %d of node %s: %w", c.Version, c.NodeID, err)
	}
	return nil
}

// CredentialVersionsOf lists a node's versions, newest first.
func (t *Tx) CredentialVersionsOf(ctx context.Context, nodeID string) ([]CredentialVersion, error) {
	rows, err := t.query(ctx, `SELECT `+credCols+` FROM bmc_credential_versions WHERE node_id = ? ORDER BY version DESC`, nodeID)
	return collect(rows, err, "credential versions", scanCred)
}

// CredentialVersions lists a node's versions, newest first.
func (s *Store) CredentialVersions(ctx context.Context, nodeID string) ([]CredentialVersion, error) {
	rows, err := s.queryRows(ctx, `SELECT `+credCols+` FROM bmc_credential_versions WHERE node_id = ? ORDER BY version DESC`, nodeID)
	return collect(rows, err, "credential versions", scanCred)
}

// PendingCredentialVersion returns the node's pending version, if any.
func (t *Tx) PendingCredentialVersion(ctx context.Context, nodeID string) (CredentialVersion, bool, error) {
	c, err := scanCred(t.queryRow(ctx, `SELECT `+credCols+` FROM bmc_credential_versions WHERE node_id = ? AND state = ? ORDER BY version DESC LIMIT 1`, nodeID, CredPending))
	if errors.Is(err, sql.ErrNoRows) {
		return CredentialVersion{}, false, nil
	}
	if err != nil {
		return CredentialVersion{}, false, fmt.Errorf("reading pending credential of node %s: %w", nodeID, err)
	}
	return c, true, nil
}

// supersededWithSecretsQuery reads the oldest versions of a state whose secret is still stored
// (bmc_credential_versions_unpurged): every verified rotation runs it, in the writer, and the
// versions ever made are many more.
const supersededWithSecretsQuery = `SELECT ` + credCols + ` FROM bmc_credential_versions WHERE state = ? AND password_ref <> ''
	ORDER BY created_at LIMIT ?`

// SupersededWithSecrets lists superseded versions whose password secret is still stored.
func (t *Tx) SupersededWithSecrets(ctx context.Context, limit int) ([]CredentialVersion, error) {
	rows, err := t.query(ctx, supersededWithSecretsQuery, CredSuperseded, limit)
	return collect(rows, err, "superseded credentials", scanCred)
}

// OpenCommandsNaming counts a node's unfinished commands whose arguments name ref.
func (t *Tx) OpenCommandsNaming(ctx context.Context, nodeID, ref string) (int, error) {
	var n int
	err := t.queryRow(ctx, `SELECT COUNT(*) FROM commands WHERE node_id = ? AND state IN ('held', 'queued', 'delivered', 'running') AND args LIKE ?`,
		nodeID, "%"+ref+"%").Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("counting commands naming a credential of node %s: %w", nodeID, err)
	}
	return n, nil
}
