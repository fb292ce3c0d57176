package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// CASealID is the id the installation CA's keys (active and next) are sealed under.
const CASealID = "installation-ca"

// InstallationCA is the agent CA every server of the installation shares: its certificate, and
// its private key sealed with the installation's sealing key; during a rotation, the next CA
// (staged, with its sealed key) or the previous one (certificate only), never both.
type InstallationCA struct {
	CertPEM   string
	SealedKey []byte
	CreatedAt int64
	// NextCertPEM and NextSealedKey: the staged CA ("" / nil: none).
	NextCertPEM   string
	NextSealedKey []byte
	// PreviousCertPEM: the retired signer, still trusted ("" none), followed (activations from
	// the cross-signing on) by the active CA cross-signed by it (pki.CA.CrossSign).
	PreviousCertPEM string
	// RetiredPEM: the CAs finished rotations retired (certificates only, oldest first), kept
	// for audits of what they certified (attested results), trusted for nothing live.
	RetiredPEM string
	// Version counts the changes of the row (1 when stored); ChangedAt is the last one's time.
	Version, ChangedAt int64
}

const installationCAColumns = `cert_pem, sealed_key, created_at, next_cert_pem, next_sealed_key, previous_cert_pem, version, changed_at, retired_pem`

func scanInstallationCA(row rowScanner) (InstallationCA, error) {
	var ca InstallationCA
	err := row.Scan(&ca.CertPEM, &ca.SealedKey, &ca.CreatedAt, &ca.NextCertPEM, &ca.NextSealedKey, &ca.PreviousCertPEM, &ca.Version, &ca.ChangedAt, &ca.RetiredPEM)
	return ca, err
}

// InstallationCA returns the stored agent CA; ok is false when none is stored yet.
func (s *Store) InstallationCA(ctx context.Context) (ca InstallationCA, ok bool, err error) {
	ca, err = scanInstallationCA(s.queryRow(ctx, `SELECT `+installationCAColumns+` FROM installation_ca WHERE id = 1`))
	if errors.Is(err, sql.ErrNoRows) {
		return InstallationCA{}, false, nil
	}
	if err != nil {
		return InstallationCA{}, false, fmt.Errorf("reading the installation's agent CA: %w", err)
	}
	return ca, true, nil
}

// InstallationCAVersion is the stored agent CA's version (0: none stored): servers compare it
// with the one they loaded, and reload on a change.
func (s *Store) InstallationCAVersion(ctx context.Context) (int64, error) {
	var v int64
	err := s.queryRow(ctx, `SELECT version FROM installation_ca WHERE id = 1`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the version of the installation's agent CA: %w", err)
	}
	return v, nil
}

// InstallationCA reads the stored agent CA in the transaction (ErrNotFound: none).
func (t *Tx) InstallationCA(ctx context.Context) (InstallationCA, error) {
	ca, err := scanInstallationCA(t.queryRow(ctx, `SELECT `+installationCAColumns+` FROM installation_ca WHERE id = 1`))
	if errors.Is(err, sql.ErrNoRows) {
		return InstallationCA{}, fmt.Errorf("the installation's agent CA: %w", ErrNotFound)
	}
	if err != nil {
		return InstallationCA{}, fmt.Errorf("reading the installation's agent CA: %w", err)
	}
	return ca, nil
}

// UpdateInstallationCA replaces the rotation columns of the stored agent CA (the active CA, the
// next and the previous one) if its version is still ca.Version, and bumps the version; a row
// changed meanwhile by another server is left alone (ErrStale). It refuses a next and a
// previous CA at once. It returns the row as stored.
func (t *Tx) UpdateInstallationCA(ctx context.Context, ca InstallationCA) (InstallationCA, error) {
	if ca.NextCertPEM != "" && ca.PreviousCertPEM != "" {
		return InstallationCA{}, errors.New("updating the installation's agent CA: a next and a previous CA at once")
	}
	if ca.CertPEM == "" || len(ca.SealedKey) == 0 || (ca.NextCertPEM == "") != (len(ca.NextSealedKey) == 0) {
		return InstallationCA{}, errors.New("updating the installation's agent CA: the active CA and a next one need a certificate and a sealed key")
	}
	var next any
	if len(ca.NextSealedKey) > 0 {
		next = ca.NextSealedKey
	}
	res, err := t.exec(ctx, `UPDATE installation_ca SET cert_pem = ?, sealed_key = ?, next_cert_pem = ?, next_sealed_key = ?, previous_cert_pem = ?,
		retired_pem = ?, version = version + 1, changed_at = ? WHERE id = 1 AND version = ?`,
		ca.CertPEM, ca.SealedKey, ca.NextCertPEM, next, ca.PreviousCertPEM, ca.RetiredPEM, t.at, ca.Version)
	if err != nil {
		return InstallationCA{}, fmt.Errorf("updating the installation's agent CA: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return InstallationCA{}, fmt.Errorf("updating the installation's agent CA: %w", err)
	} else if n == 0 {
		return InstallationCA{}, fmt.Errorf("updating the installation's agent CA (version %d): %w", ca.Version, ErrStale)
	}
	return t.InstallationCA(ctx)
}

// AgentCATrust is what an agent said of its CAs at its last connection (AgentCAs, recorded
// with its row by UpsertAgent), with the agent's connection as the agents table holds it.
type AgentCATrust struct {
	AgentID, Kind, SiteID, NodeID string
	Connected                     bool
	// Reported is false when the agent's connection recorded nothing of its CAs (it connected
	// before this was recorded, or said something out of bounds).
	Reported bool
	// Trusted: fingerprints of the CA certificates it trusts; CertIssuer: of the CA that issued
	// the certificate it connected with; CertNotAfter: that certificate's end (microseconds).
	Trusted      []string
	CertIssuer   string
	CertNotAfter int64
	ReportedAt   int64
}

// Holds says whether the agent reported trusting the CA of fingerprint fp.
func (a AgentCATrust) Holds(fp string) bool { return slices.Contains(a.Trusted, fp) }

// MaxAgentCAs bounds the CAs an agent may say it trusts (AgentCAs.Check): a rotation hands out
// two at most.
const MaxAgentCAs = 8

// isFingerprint says whether fp may be a hex SHA-256 as pki.Fingerprint writes it: lower-case
// hex, 64 digits at most.
func isFingerprint(fp string) bool {
	if fp == "" || len(fp) > 64 {
		return false
	}
	for i := 0; i < len(fp); i++ {
		if c := fp[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// AgentCAs is what an agent says of its CAs as it connects: the fingerprints of the CA
// certificates it trusts (its hello's) and of the CA that issued the certificate it connected
// with ("" none known).
type AgentCAs struct {
	Trusted []string
	Issuer  string
}

// Check holds what an agent says to at most MaxAgentCAs fingerprints, each a hex SHA-256: a
// lessee's installed OS says it too, and its agent row is rewritten at every connection.
func (c AgentCAs) Check() error {
	if len(c.Trusted) > MaxAgentCAs {
		return fmt.Errorf("the CAs an agent trusts: %d fingerprints, at most %d", len(c.Trusted), MaxAgentCAs)
	}
	for i, fp := range c.Trusted {
		if !isFingerprint(fp) {
			return fmt.Errorf("the CAs an agent trusts: fingerprint %d: hex SHA-256 expected", i+1)
		}
	}
	if c.Issuer != "" && !isFingerprint(c.Issuer) {
		return errors.New("the CAs an agent trusts: the certificate's issuer: hex SHA-256 expected")
	}
	return nil
}

// ConnectedAgentsCATrust lists the agents connected now with what each said of its CAs, by id.
func (s *Store) ConnectedAgentsCATrust(ctx context.Context) ([]AgentCATrust, error) {
	rows, err := s.queryRows(ctx, `SELECT id, kind, site_id, node_id, connected, ca_reported_at, trusted_cas, issuer_ca, cert_not_after
		FROM agents WHERE connected = ? ORDER BY id`, true)
	if err != nil {
		return nil, fmt.Errorf("listing the CAs connected agents trust: %w", err)
	}
	defer rows.Close()
	var out []AgentCATrust
	for rows.Next() {
		var a AgentCATrust
		var trusted string
		if err := rows.Scan(&a.AgentID, &a.Kind, &a.SiteID, &a.NodeID, &a.Connected, &a.ReportedAt, &trusted, &a.CertIssuer, &a.CertNotAfter); err != nil {
			return nil, fmt.Errorf("listing the CAs connected agents trust: %w", err)
		}
		a.Reported = a.ReportedAt > 0
		if trusted != "" {
			a.Trusted = strings.Split(trusted, ",")
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// OfferInstallationCA stores ca as the installation's agent CA unless one is stored already,
// and returns the one stored: ca itself, or the CA of a server that stored its own first (two
// replicas starting on an empty store both offer theirs; one wins, and both use it).
func (s *Store) OfferInstallationCA(ctx context.Context, ca InstallationCA) (InstallationCA, error) {
	var out InstallationCA
	err := s.Write(ctx, func(tx *Tx) error {
		if _, err := tx.exec(ctx, `INSERT INTO installation_ca (id, cert_pem, sealed_key, created_at) VALUES (1, ?, ?, ?) ON CONFLICT (id) DO NOTHING`,
			ca.CertPEM, ca.SealedKey, tx.at); err != nil {
			return fmt.Errorf("storing the installation's agent CA: %w", err)
		}
		var err error
		if out, err = scanInstallationCA(tx.queryRow(ctx, `SELECT `+installationCAColumns+` FROM installation_ca WHERE id = 1`)); err != nil {
			return fmt.Errorf("reading the installation's agent CA back: %w", err)
		}
		return nil
	})
	return out, err
}
