package server

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"bcd/internal/auth"
	"bcd/internal/metal"
	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestRotationReachesEveryServer: two servers share a store; a rotation's stages, made through
// the API of one, reach the CAs of both at their next refresh, without a restart. A node's
// result signed with a certificate the first CA issued verifies on the other server during the
// overlap, and is refused once the rotation finished. The new CA's key is stored sealed.
func TestRotationReachesEveryServer(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) {
			ctx := context.Background()
			quiet := slog.New(slog.DiscardHandler)
			st, sealer := storetest.Open(t, e), newSealer(t)
			var servers []*caKeeper
			for range 2 {
				ca, err := installationCA(ctx, st, sealer, filepath.Join(t.TempDir(), "ca"), quiet)
				if err != nil {
					t.Fatal(err)
				}
				k := &caKeeper{st: st, sealer: sealer, ca: ca, log: quiet}
				if err := k.refresh(ctx); err != nil {
					t.Fatal(err)
				}
				servers = append(servers, k)
			}
			refreshAll := func() {
				t.Helper()
				for _, k := range servers {
					if err := k.refresh(ctx); err != nil {
						t.Fatal(err)
					}
				}
			}
			first := servers[0].ca.Fingerprint()
			key, csr, err := pki.NewKeyAndCSR("node")
			if err != nil {
				t.Fatal(err)
			}
			nodeCert, err := servers[0].ca.IssueNode(csr, "n1", 2, time.Hour, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			stmt := pki.Statement{CommandID: "c1", NodeID: "n1", Kind: "disk.wipe", Generation: 2, ResultSHA256: pki.ResultDigest([]byte(`{}`))}
			sig, err := pki.SignStatement(key, stmt)
			if err != nil {
				t.Fatal(err)
			}

			svc := metal.New(st, sealer, quiet)
			admin := auth.Principal{Name: "root", Role: auth.Admin}
			rot, err := svc.RotateAgentCA(ctx, admin, "test")
			if err != nil {
				t.Fatal(err)
			}
			next := pki.Fingerprint(rot.Rotation.Next.Raw)
			row, _, err := st.InstallationCA(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(row.NextSealedKey, []byte("PRIVATE KEY")) || len(row.NextSealedKey) == 0 {
				t.Fatal("the next CA's key is not stored sealed")
			}
			// A tenant's admin may not rotate the installation's CA.
			var forb *metal.ForbiddenError
			if _, err := svc.ActivateAgentCA(ctx, auth.Principal{Name: "t", Role: auth.Admin, TenantID: "t1"}, "", true); !errors.As(err, &forb) {
				t.Fatalf("a tenant admin activating: %v; want forbidden", err)
			}
			refreshAll()
			for i, k := range servers {
				if got := k.ca.Trusted(); !slices.Equal(got, []string{first, next}) || k.ca.Fingerprint() != first {
					t.Fatalf("staged: server %d trusts %v, signs with %s", i, got, k.ca.Fingerprint())
				}
			}
			if _, err := svc.ActivateAgentCA(ctx, admin, "test", false); err != nil {
				t.Fatal(err) // no agent is connected
			}
			refreshAll()
			for i, k := range servers {
				if k.ca.Fingerprint() != next {
					t.Fatalf("overlap: server %d signs with %s, want %s", i, k.ca.Fingerprint(), next)
				}
			}
			// Every server, and one started during the overlap, chains its gateway certificate
			// to the new CA cross-signed by the previous one: the one made at the activation.
			mid, err := installationCA(ctx, st, sealer, filepath.Join(t.TempDir(), "ca"), quiet)
			if err != nil {
				t.Fatal(err)
			}
			var cross *x509.Certificate
			for i, ca := range []*pki.CA{servers[0].ca, servers[1].ca, mid} {
				r := ca.Rotation()
				c := r.Cross
				if c == nil || r.Previous == nil || c.CheckSignatureFrom(r.Previous) != nil || !bytes.Equal(c.RawSubjectPublicKeyInfo, r.Active.RawSubjectPublicKeyInfo) {
					t.Fatalf("overlap: server %d has no cross-signed CA of the new one by the previous one", i)
				}
				if cross == nil {
					cross = c
				} else if !c.Equal(cross) {
					t.Fatalf("overlap: server %d has another cross-signed CA", i)
				}
			}
			other := servers[1].ca
			if err := pki.VerifyStatement(other, nodeCert, stmt, sig, 2, time.Now()); err != nil {
				t.Fatalf("overlap: a result attested with the previous CA's certificate: %v", err)
			}
			// The new signer issues on both.
			_, csr2, _ := pki.NewKeyAndCSR("node")
			der, err := other.IssueNode(csr2, "n2", 1, time.Hour, time.Now())
			if err != nil || other.IssuerOf(der) != next {
				t.Fatalf("overlap: issued by %q (%v), want the new CA", other.IssuerOf(der), err)
			}
			// An agent connected with a certificate of the previous CA holds the finish back,
			// named; one renewed (the new CA's) does not; force goes ahead.
			for _, a := range []struct {
				id, issuer string
			}{{"sa-old", first}, {"sa-new", next}} {
				said := &store.AgentCAs{Trusted: []string{next, first}, Issuer: a.issuer}
				if err := st.Write(ctx, func(tx *store.Tx) error {
					return tx.UpsertAgent(ctx, store.Agent{ID: a.id, Kind: "site", SiteID: "s", ConnID: a.id, CertNotAfter: time.Now().Add(time.Hour).UnixMicro(), CAs: said})
				}); err != nil {
					t.Fatal(err)
				}
			}
			var conflict *metal.ConflictError
			_, err = svc.FinishAgentCA(ctx, admin, "test", false)
			if !errors.As(err, &conflict) || !strings.Contains(err.Error(), "sa-old") || strings.Contains(err.Error(), "sa-new") {
				t.Fatalf("finish with an agent on the previous CA's certificate: %v; want a conflict naming it alone", err)
			}
			arrived := time.Now() // the result arrived during the overlap
			if _, err := svc.FinishAgentCA(ctx, admin, "test", true); err != nil {
				t.Fatal(err)
			}
			refreshAll()
			if err := pki.VerifyStatement(other, nodeCert, stmt, sig, 2, time.Now()); !errors.Is(err, pki.ErrUnknownCA) {
				t.Fatalf("finished: a result attested with the retired CA's certificate: %v; want ErrUnknownCA", err)
			}
			// An audit of the stored result (a wipe proof made before the rotation) still
			// verifies: the retired CA is kept for that, on every server.
			for i, k := range servers {
				if err := pki.VerifyRecordedStatement(k.ca, nodeCert, stmt, sig, 2, arrived); err != nil {
					t.Fatalf("finished: server %d's audit of a result attested under the retired CA: %v", i, err)
				}
				if err := pki.VerifyRecordedStatement(k.ca, nodeCert, stmt, sig, 2, time.Now().Add(time.Second)); !errors.Is(err, pki.ErrUnknownCA) {
					t.Fatalf("finished: server %d's audit of a result arriving after the CA was retired: %v; want ErrUnknownCA", i, err)
				}
			}
			for i, k := range servers {
				if got := k.ca.Trusted(); !slices.Equal(got, []string{next}) {
					t.Fatalf("finished: server %d trusts %v", i, got)
				}
				if k.ca.Rotation().Cross != nil {
					t.Fatalf("finished: server %d still has the cross-signed CA", i)
				}
			}
			if row, _, err = st.InstallationCA(ctx); err != nil {
				t.Fatal(err)
			}
			if row.PreviousCertPEM != "" || len(pki.BundleCerts([]byte(row.RetiredPEM))) != 1 {
				t.Fatalf("finished: previous %q, %d retired certificates; want none and the previous CA alone", row.PreviousCertPEM, len(pki.BundleCerts([]byte(row.RetiredPEM))))
			}
			// A server started afterwards loads the rotated CA.
			late, err := installationCA(ctx, st, sealer, filepath.Join(t.TempDir(), "ca"), quiet)
			if err != nil || late.Fingerprint() != next {
				t.Fatalf("a server started after the rotation signs with %v (%v)", late, err)
			}
			if err := pki.VerifyRecordedStatement(late, nodeCert, stmt, sig, 2, arrived); err != nil {
				t.Fatalf("a server started after the rotation: the audit of a result attested under the retired CA: %v", err)
			}
			if _, err := svc.FinishAgentCA(ctx, admin, "again", false); err == nil {
				t.Fatal("finish with no rotation in progress was accepted")
			}
		})
	}
}
