package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"bcd/internal/pki"
	"bcd/internal/secrets"
	"bcd/internal/store"
)

// openCA loads one stored CA: its certificate and its key, unsealed.
func openCA(what, certPEM string, sealed []byte, sealer *secrets.Sealer) (*pki.CA, error) {
	keyPEM, err := sealer.Open(caSealID, sealed)
	if errors.Is(err, secrets.ErrTampered) {
		return nil, fmt.Errorf("opening the installation's %s agent CA: its key was sealed with another sealing key: every server sharing a store needs the same sealing key (--seal-key-file or BCD_SEAL_KEY)", what)
	}
	if err != nil {
		return nil, fmt.Errorf("opening the installation's %s agent CA: %w", what, err)
	}
	ca, err := pki.LoadCA([]byte(certPEM), keyPEM)
	if err != nil {
		return nil, fmt.Errorf("loading the installation's %s agent CA: %w", what, err)
	}
	return ca, nil
}

// applyRotation makes ca sign and trust as the stored row says: its active CA signs; the next
// (staged) or previous (retired) one is trusted too. The previous CA's PEM carries, after it,
// the active CA cross-signed by it at the activation: the gateway presents that after its own
// certificate until the rotation finishes (pki.ServerCert).
func applyRotation(ca *pki.CA, row store.InstallationCA, sealer *secrets.Sealer) error {
	active, err := openCA("active", row.CertPEM, row.SealedKey, sealer)
	if err != nil {
		return err
	}
	var next *pki.CA
	if row.NextCertPEM != "" {
		if next, err = openCA("next", row.NextCertPEM, row.NextSealedKey, sealer); err != nil {
			return err
		}
	}
	if err := ca.SetRotation(active, next, []byte(row.PreviousCertPEM)); err != nil {
		return err
	}
	return ca.SetRetired([]byte(row.RetiredPEM))
}

// caRefreshInterval is how often a server looks for a change of the installation's CAs (a
// rotation's stage, made through any server of the installation).
const caRefreshInterval = 5 * time.Second

// caKeeper keeps a server's CA as the store holds it: every server sharing the store picks up a
// rotation's stage within caRefreshInterval, without a restart.
type caKeeper struct {
	st interface {
		InstallationCA(ctx context.Context) (store.InstallationCA, bool, error)
		InstallationCAVersion(ctx context.Context) (int64, error)
	}
	sealer  *secrets.Sealer
	ca      *pki.CA
	log     *slog.Logger
	version atomic.Int64 // of the row ca was last set from
}

// refresh reloads the CAs when the stored row's version is not the one loaded.
func (k *caKeeper) refresh(ctx context.Context) error {
	v, err := k.st.InstallationCAVersion(ctx)
	if err != nil || v == k.version.Load() {
		return err
	}
	row, ok, err := k.st.InstallationCA(ctx)
	if err != nil || !ok {
		return err
	}
	before := k.ca.Rotation()
	if err := applyRotation(k.ca, row, k.sealer); err != nil {
		return err
	}
	k.version.Store(row.Version)
	after := k.ca.Rotation()
	if before.Stage() != after.Stage() || !before.Active.Equal(after.Active) {
		k.log.Info("agent CA changed", "stage", after.Stage(), "active", k.ca.Fingerprint(), "trusted", k.ca.Trusted(),
			"cross_signed", after.Cross != nil, "version", row.Version)
	}
	return nil
}

// run refreshes every interval until ctx ends.
func (k *caKeeper) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := k.refresh(ctx)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			failing = true
			k.log.Error("reading the installation's agent CA; keeping the CAs loaded", "error", err)
		case err == nil && failing:
			failing = false
			k.log.Info("reading the installation's agent CA works again")
		}
	}
}
