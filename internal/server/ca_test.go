package server

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/pki"
	"bcd/internal/secrets"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

func newSealer(t *testing.T) *secrets.Sealer {
	t.Helper()
	key, err := secrets.LoadOrCreateKey(filepath.Join(t.TempDir(), "seal.key"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := secrets.NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// writeCADir keeps ca in dir as a server did before the CA moved into the store.
func writeCADir(t *testing.T, dir string, ca *pki.CA) {
	t.Helper()
	keyPEM, _ := ca.KeyPEM()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, pki.CAKeyFile), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, pki.CACertFile), ca.CertPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestInstallationCA: every server sharing a store gets the same agent CA, whatever its data
// dir; the first start adopts a data dir's CA; a server with another sealing key is refused
// with a message that says what to fix and shows no key.
func TestInstallationCA(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			t.Run("new installation, then a second server", func(t *testing.T) {
				st, sealer := storetest.Open(t, e), newSealer(t)
				first, err := installationCA(ctx, st, sealer, filepath.Join(t.TempDir(), "ca"), quiet)
				if err != nil {
					t.Fatal(err)
				}
				second, err := installationCA(ctx, st, sealer, filepath.Join(t.TempDir(), "ca"), quiet)
				if err != nil {
					t.Fatal(err)
				}
				if first.Fingerprint() != second.Fingerprint() {
					t.Fatal("two servers of one store have different CAs")
				}
				// The second server can check what the first issued.
				_, key, err := first.IssueServer([]string{"127.0.0.1"}, time.Hour, time.Now())
				if err != nil || len(key) == 0 {
					t.Fatal(err)
				}
				stored, ok, err := st.InstallationCA(ctx)
				if err != nil || !ok {
					t.Fatalf("stored %v, %v", ok, err)
				}
				keyPEM, _ := first.KeyPEM()
				if bytes.Contains(stored.SealedKey, keyPEM) || strings.Contains(stored.CertPEM, "PRIVATE KEY") {
					t.Fatal("the CA key is stored in the clear")
				}
			})
			t.Run("adopts the data dir's CA", func(t *testing.T) {
				st, sealer := storetest.Open(t, e), newSealer(t)
				old, err := pki.CreateCA("old server CA", time.Now())
				if err != nil {
					t.Fatal(err)
				}
				dir := filepath.Join(t.TempDir(), "ca")
				writeCADir(t, dir, old)
				got, err := installationCA(ctx, st, sealer, dir, quiet)
				if err != nil {
					t.Fatal(err)
				}
				if got.Fingerprint() != old.Fingerprint() {
					t.Fatal("the data dir's CA was not adopted")
				}
				// Another server's own data dir CA loses to the installation's, with a warning.
				other, _ := pki.CreateCA("stray CA", time.Now())
				otherDir := filepath.Join(t.TempDir(), "ca")
				writeCADir(t, otherDir, other)
				var logs bytes.Buffer
				got, err = installationCA(ctx, st, sealer, otherDir, slog.New(slog.NewTextHandler(&logs, nil)))
				if err != nil {
					t.Fatal(err)
				}
				if got.Fingerprint() != old.Fingerprint() || !strings.Contains(logs.String(), "not the installation's") {
					t.Fatalf("stray data dir CA: got %s, log %q", got.Fingerprint(), logs.String())
				}
				// A broken one (its key lost) is reported, and does not keep the server from
				// starting with the installation's.
				if err := os.Remove(filepath.Join(otherDir, pki.CAKeyFile)); err != nil {
					t.Fatal(err)
				}
				logs.Reset()
				got, err = installationCA(ctx, st, sealer, otherDir, slog.New(slog.NewTextHandler(&logs, nil)))
				if err != nil || got.Fingerprint() != old.Fingerprint() || !strings.Contains(logs.String(), "does not load") {
					t.Fatalf("broken data dir CA: %v, log %q", err, logs.String())
				}
				// On a store without a CA, a broken data dir CA stops the first start.
				if _, err := installationCA(ctx, storetest.Open(t, e), sealer, otherDir, quiet); err == nil {
					t.Fatal("a first start stored a new CA beside a broken one in the data dir")
				}
			})
			t.Run("another sealing key", func(t *testing.T) {
				st := storetest.Open(t, e)
				if _, err := installationCA(ctx, st, newSealer(t), filepath.Join(t.TempDir(), "ca"), quiet); err != nil {
					t.Fatal(err)
				}
				_, err := installationCA(ctx, st, newSealer(t), filepath.Join(t.TempDir(), "ca"), quiet)
				if err == nil || !strings.Contains(err.Error(), "same sealing key") {
					t.Fatalf("got %v, want an error naming the sealing key", err)
				}
				if strings.Contains(err.Error(), "PRIVATE") {
					t.Fatalf("error shows key material: %v", err)
				}
			})
			t.Run("servers starting at once", func(t *testing.T) {
				if e != store.Postgres {
					t.Skip("an SQLite store belongs to one server")
				}
				dsn := storetest.DSN(t, e)
				sealer := newSealer(t)
				const n = 4
				fps := make([]string, n)
				errs := make([]error, n)
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() {
						st, err := store.Open(ctx, dsn)
						if err != nil {
							errs[i] = err
							return
						}
						defer st.Close()
						ca, err := installationCA(ctx, st, sealer, filepath.Join(t.TempDir(), "ca"), quiet)
						if err != nil {
							errs[i] = err
							return
						}
						fps[i] = ca.Fingerprint()
					})
				}
				wg.Wait()
				for i := range n {
					if errs[i] != nil {
						t.Fatalf("server %d: %v", i, errs[i])
					}
					if fps[i] != fps[0] {
						t.Fatalf("server %d has CA %s, server 0 %s", i, fps[i], fps[0])
					}
				}
			})
		})
	}
}
