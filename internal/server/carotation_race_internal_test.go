package server

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"bcd/internal/auth"
	"bcd/internal/metal"
	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestRotationStagesRaceAcrossServers: two servers (each its own connection pool on one
// PostgreSQL store; on SQLite, one store) run each stage of a rotation at the same moment:
// one of them changes the row, the other is refused as a conflict (never a second staged CA,
// never a stage applied twice), and one event is recorded per stage. Rotating again during the
// overlap is refused. A server down through the whole rotation starts on its outcome, and a
// server whose store is out keeps the CAs it loaded, whole.
func TestRotationStagesRaceAcrossServers(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			ctx := context.Background()
			quiet := slog.New(slog.DiscardHandler)
			dsn := storetest.DSN(t, e)
			open := func() *store.Store {
				st, err := store.Open(ctx, dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { st.Close() })
				return st
			}
			sealer := newSealer(t)
			stores := []*store.Store{open()}
			if e == store.Postgres {
				stores = append(stores, open())
			} else {
				stores = append(stores, stores[0])
			}
			first, err := installationCA(ctx, stores[0], sealer, filepath.Join(t.TempDir(), "ca"), quiet)
			if err != nil {
				t.Fatal(err)
			}
			var svcs []*metal.Service
			for _, st := range stores {
				svcs = append(svcs, metal.New(st, sealer, quiet))
			}
			admin := auth.Principal{Name: "root", Role: auth.Admin}
			verbs := []struct {
				name, event string
				run         func(*metal.Service) (metal.AgentCARotation, error)
				stage       string
			}{
				{"rotate", "control_plane.ca_rotated", func(s *metal.Service) (metal.AgentCARotation, error) {
					return s.RotateAgentCA(ctx, admin, "race")
				}, pki.StageStaged},
				{"activate", "control_plane.ca_activated", func(s *metal.Service) (metal.AgentCARotation, error) {
					return s.ActivateAgentCA(ctx, admin, "race", false)
				}, pki.StageOverlap},
				{"finish", "control_plane.ca_finished", func(s *metal.Service) (metal.AgentCARotation, error) {
					return s.FinishAgentCA(ctx, admin, "race", false)
				}, pki.StageSteady},
			}
			for i, v := range verbs {
				before, _, err := stores[0].InstallationCA(ctx)
				if err != nil {
					t.Fatal(err)
				}
				start := make(chan struct{})
				errs := make([]error, len(svcs))
				outs := make([]metal.AgentCARotation, len(svcs))
				var wg sync.WaitGroup
				for j, s := range svcs {
					wg.Go(func() {
						<-start
						outs[j], errs[j] = v.run(s)
					})
				}
				close(start)
				wg.Wait()
				won := slices.IndexFunc(errs, func(err error) bool { return err == nil })
				if won < 0 {
					t.Fatalf("%s: both servers failed: %v", v.name, errs)
				}
				for j, err := range errs {
					var conflict *metal.ConflictError
					if j != won && !errors.As(err, &conflict) {
						t.Fatalf("%s: the second server's answer is %v, want a conflict", v.name, err)
					}
				}
				after, _, err := stores[0].InstallationCA(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if after.Version != before.Version+1 {
					t.Fatalf("%s: version %d → %d, want one change", v.name, before.Version, after.Version)
				}
				if got := outs[won].Rotation.Stage(); got != v.stage {
					t.Fatalf("%s: stage %s, want %s", v.name, got, v.stage)
				}
				if i == 0 && pki.Fingerprint(outs[won].Rotation.Next.Raw) != fingerprintOf(t, after.NextCertPEM) {
					t.Fatalf("rotate: the stored next CA is not the one the winner staged")
				}
				evs, err := stores[0].Events(ctx, store.EventFilter{Limit: 1000})
				if err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, ev := range evs {
					if ev.Kind == v.event {
						n++
						if strings.Contains(ev.Data, "PRIVATE") {
							t.Fatalf("%s: the event shows a key: %s", v.name, ev.Data)
						}
					}
				}
				if n != 1 {
					t.Fatalf("%s: %d %s events, want 1", v.name, n, v.event)
				}
				if v.name == "activate" {
					var conflict *metal.ConflictError
					if _, err := svcs[1].RotateAgentCA(ctx, admin, "again"); !errors.As(err, &conflict) {
						t.Fatalf("rotating during the overlap: %v, want refused", err)
					}
				}
			}

			// A server down through the rotation starts on its outcome: the new CA alone, the
			// first one kept for audits only.
			late, err := installationCA(ctx, stores[1], sealer, filepath.Join(t.TempDir(), "ca"), quiet)
			if err != nil {
				t.Fatal(err)
			}
			if late.Fingerprint() == first.Fingerprint() || !slices.Equal(late.Trusted(), []string{late.Fingerprint()}) {
				t.Fatalf("a server started after the rotation trusts %v (active %s), want the new CA alone", late.Trusted(), late.Fingerprint())
			}
			if !strings.Contains(string(late.AuditPEM()), strings.TrimSpace(string(first.CertPEM()))) {
				t.Fatal("a server started after the rotation does not keep the retired CA for audits")
			}

			// A server whose store is out keeps what it loaded.
			k := &caKeeper{st: failingCAStore{}, sealer: sealer, ca: first, log: quiet}
			trusted, active := first.Trusted(), first.Fingerprint()
			if err := k.refresh(ctx); err == nil {
				t.Fatal("refreshing from a store that is out did not fail")
			}
			if !slices.Equal(first.Trusted(), trusted) || first.Fingerprint() != active {
				t.Fatalf("after a failed refresh the CA trusts %v (active %s), want %v (%s)", first.Trusted(), first.Fingerprint(), trusted, active)
			}
		})
	}
}

func fingerprintOf(t *testing.T, certPEM string) string {
	t.Helper()
	c, _, err := pki.ParseCACertPEM([]byte(certPEM))
	if err != nil {
		t.Fatal(err)
	}
	return pki.Fingerprint(c.Raw)
}

// failingCAStore is a store that is out.
type failingCAStore struct{}

func (failingCAStore) InstallationCA(context.Context) (store.InstallationCA, bool, error) {
	return store.InstallationCA{}, false, errors.New("store out")
}

func (failingCAStore) InstallationCAVersion(context.Context) (int64, error) {
	return 0, errors.New("store out")
}
