package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"bcd/internal/pki"
	"bcd/internal/secrets"
	"bcd/internal/store"
)

// caSealID is the id the installation CA's keys are sealed under.
const caSealID = store.CASealID

// caStore is the part of the store installationCA uses.
type caStore interface {
	InstallationCA(ctx context.Context) (store.InstallationCA, bool, error)
	OfferInstallationCA(ctx context.Context, ca store.InstallationCA) (store.InstallationCA, error)
}

// installationCA returns the agent CA of the installation: kept in the store, its key sealed
// with the sealing key, so every server sharing the store signs and checks agent certificates
// with the same CA. On an installation's first start it is the CA a server of an earlier
// version kept in dir, or a new one; of two servers starting at once on an empty store, the
// first to store its CA wins and both use it.
func installationCA(ctx context.Context, st caStore, sealer *secrets.Sealer, dir string, log *slog.Logger) (*pki.CA, error) {
	stored, ok, err := st.InstallationCA(ctx)
	if err != nil {
		return nil, err
	}
	local, found, err := pki.LoadCADir(dir)
	switch {
	case err != nil && !ok:
		// About to store a CA: one left broken in the data dir may be what agents trust.
		return nil, err
	case err != nil:
		log.Warn("the data dir holds a CA that does not load; the installation's is used", "dir", dir, "error", err)
		found = false
	}
	if !ok {
		from := "new"
		if !found {
			if local, err = pki.CreateCA("bcd CA", time.Now()); err != nil {
				return nil, err
			}
		} else {
			from = dir
		}
		keyPEM, err := local.KeyPEM()
		if err != nil {
			return nil, err
		}
		sealed, err := sealer.Seal(caSealID, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("sealing the agent CA's key: %w", err)
		}
		if stored, err = st.OfferInstallationCA(ctx, store.InstallationCA{CertPEM: string(local.CertPEM()), SealedKey: sealed}); err != nil {
			return nil, err
		}
		if stored.CertPEM == string(local.CertPEM()) {
			log.Info("agent CA stored for the installation", "from", from, "fingerprint", local.Fingerprint())
		}
	}
	keyPEM, err := sealer.Open(caSealID, stored.SealedKey)
	if errors.Is(err, secrets.ErrTampered) {
		return nil, fmt.Errorf("opening the installation's agent CA: its key was sealed with another sealing key: every server sharing a store needs the same sealing key (--seal-key-file or BCD_SEAL_KEY)")
	}
	if err != nil {
		return nil, fmt.Errorf("opening the installation's agent CA: %w", err)
	}
	ca, err := pki.LoadCA([]byte(stored.CertPEM), keyPEM)
	if err != nil {
		return nil, fmt.Errorf("loading the installation's agent CA: %w", err)
	}
	if err := applyRotation(ca, stored, sealer); err != nil {
		return nil, err
	}
	if found && local.Fingerprint() != ca.Fingerprint() {
		log.Warn("the CA in the data dir is not the installation's and is not used: agents joined with it must join again",
			"dir", dir, "data_dir_ca", local.Fingerprint(), "installation_ca", ca.Fingerprint())
	}
	return ca, nil
}
