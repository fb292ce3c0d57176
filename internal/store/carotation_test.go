package store_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestInstallationCARotation: the rotation columns are replaced only at the version read (a
// second server acting on the same version is refused with ErrStale), each change bumps the
// version, and a next and a previous CA are never stored together.
func TestInstallationCARotation(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		if v, err := st.InstallationCAVersion(ctx); err != nil || v != 0 {
			t.Fatalf("version before any CA = %d, %v; want 0", v, err)
		}
		first, err := st.OfferInstallationCA(ctx, store.InstallationCA{CertPEM: "A", SealedKey: []byte("ka")})
		if err != nil {
			t.Fatal(err)
		}
		if first.Version != 1 || first.NextCertPEM != "" || first.NextSealedKey != nil || first.PreviousCertPEM != "" {
			t.Fatalf("stored CA = %+v; want version 1 and no rotation", first)
		}
		update := func(ca store.InstallationCA) (store.InstallationCA, error) {
			var out store.InstallationCA
			err := st.Write(ctx, func(tx *store.Tx) error {
				var err error
				out, err = tx.UpdateInstallationCA(ctx, ca)
				return err
			})
			return out, err
		}
		staged := first
		staged.NextCertPEM, staged.NextSealedKey = "B", []byte("kb")
		got, err := update(staged)
		if err != nil {
			t.Fatal(err)
		}
		if got.Version != 2 || got.NextCertPEM != "B" || string(got.NextSealedKey) != "kb" || got.CertPEM != "A" {
			t.Fatalf("after staging = %+v", got)
		}
		// Another server acting on what it read before: refused, nothing changed.
		if _, err := update(staged); !errors.Is(err, store.ErrStale) {
			t.Fatalf("update at an old version: %v; want ErrStale", err)
		}
		active := got
		active.CertPEM, active.SealedKey, active.NextCertPEM, active.NextSealedKey, active.PreviousCertPEM = "B", []byte("kb"), "", nil, "A"
		if got, err = update(active); err != nil {
			t.Fatal(err)
		}
		if got.Version != 3 || got.CertPEM != "B" || got.PreviousCertPEM != "A" || got.NextCertPEM != "" || got.NextSealedKey != nil {
			t.Fatalf("after activating = %+v", got)
		}
		both := got
		both.NextCertPEM, both.NextSealedKey = "C", []byte("kc")
		if _, err := update(both); err == nil {
			t.Fatal("a next and a previous CA at once were stored")
		}
		if v, err := st.InstallationCAVersion(ctx); err != nil || v != 3 {
			t.Fatalf("version = %d, %v; want 3", v, err)
		}
		read, ok, err := st.InstallationCA(ctx)
		if err != nil || !ok || read.CertPEM != got.CertPEM || read.Version != got.Version || read.PreviousCertPEM != "A" {
			t.Fatalf("read back %+v, %v, %v; want %+v", read, ok, err, got)
		}
	})
}

// TestAgentCATrust: what an agent says of its CAs is recorded with its row by the write that
// records its connection (UpsertAgent, Agent.CAs), replaced by its next connection's (one
// saying nothing is unreported); connected agents are listed with it, departed ones are not; a
// report out of bounds is refused with the connection's write, leaving the row as it was.
func TestAgentCATrust(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		connect := func(a store.Agent, cas *store.AgentCAs) error {
			a.CAs = cas
			return st.Write(ctx, func(tx *store.Tx) error { return tx.UpsertAgent(ctx, a) })
		}
		sa1 := store.Agent{ID: "sa1", Kind: "site", SiteID: "s", ConnID: "c1", CertNotAfter: 10}
		n1 := store.Agent{ID: "node:n1", Kind: "node", NodeID: "n1", Generation: 1, ConnID: "c2"}
		gone := store.Agent{ID: "sa-gone", Kind: "site", SiteID: "s", ConnID: "c3"}
		for _, c := range []struct {
			a   store.Agent
			cas *store.AgentCAs
		}{
			{sa1, &store.AgentCAs{Trusted: []string{"aa"}, Issuer: "aa"}},
			{n1, &store.AgentCAs{Trusted: []string{"aa"}, Issuer: "aa"}},
			{gone, &store.AgentCAs{Trusted: []string{"aa"}, Issuer: "aa"}},
		} {
			if err := connect(c.a, c.cas); err != nil {
				t.Fatal(err)
			}
		}
		sa1.ConnID, sa1.CertNotAfter = "c4", 20
		if err := connect(sa1, &store.AgentCAs{Trusted: []string{"aa", "bb"}, Issuer: "bb"}); err != nil {
			t.Fatal(err)
		}
		n1.ConnID = "c5" // a connection saying nothing of its CAs
		if err := connect(n1, nil); err != nil {
			t.Fatal(err)
		}
		if err := st.Write(ctx, func(tx *store.Tx) error { return tx.AgentGone(ctx, "sa-gone", "c3") }); err != nil {
			t.Fatal(err)
		}
		bad := sa1
		bad.ConnID = "c6"
		if err := connect(bad, &store.AgentCAs{Trusted: []string{"a,b"}, Issuer: "aa"}); err == nil {
			t.Fatal("a fingerprint holding a comma was recorded")
		}
		got, err := st.ConnectedAgentsCATrust(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 {
			t.Fatalf("listed %+v; want node:n1 and sa1", got)
		}
		n, s := got[0], got[1]
		if n.AgentID != "node:n1" || n.Reported || n.ReportedAt != 0 || n.Kind != "node" || n.NodeID != "n1" || len(n.Trusted) != 0 || n.CertIssuer != "" {
			t.Errorf("node agent = %+v; want unreported", n)
		}
		if s.AgentID != "sa1" || !s.Reported || s.ReportedAt == 0 || !slices.Equal(s.Trusted, []string{"aa", "bb"}) || s.CertIssuer != "bb" || s.CertNotAfter != 20 ||
			!s.Holds("bb") || s.Holds("cc") || s.SiteID != "s" {
			t.Errorf("site agent = %+v; want its last connection's report", s)
		}
	})
}
