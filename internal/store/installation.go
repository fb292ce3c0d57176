package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// InstallationCA is the agent CA every server of the installation shares: its certificate, and
// its private key sealed with the installation's sealing key.
type InstallationCA struct {
	CertPEM   string
	SealedKey []byte
	CreatedAt int64
}

// InstallationCA returns the stored agent CA; ok is false when none is stored yet.
func (s *Store) InstallationCA(ctx context.Context) (ca InstallationCA, ok bool, err error) {
	err = s.queryRow(ctx, `SELECT cert_pem, sealed_key, created_at FROM installation_ca WHERE id = 1`).Scan(&ca.CertPEM, &ca.SealedKey, &ca.CreatedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return InstallationCA{}, false, nil
	}
	if err != nil {
		return InstallationCA{}, false, fmt.Errorf("reading the installation's agent CA: %w", err)
	}
	return ca, true, nil
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
		err := tx.queryRow(ctx, `SELECT cert_pem, sealed_key, created_at FROM installation_ca WHERE id = 1`).Scan(&out.CertPEM, &out.SealedKey, &out.CreatedAt)
		if err != nil {
			return fmt.Errorf("reading the installation's agent CA back: %w", err)
		}
		return nil
	})
	return out, err
}
