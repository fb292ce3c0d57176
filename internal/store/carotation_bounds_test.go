package store_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestAgentCATrustBounds: what an agent says of its CAs (its Hello, any agent's, a lessee's
// installed OS's included) is recorded only as hex SHA-256 fingerprints, a few of them: a Hello
// naming thousands, or text, is refused rather than written into the agent's row, which every
// connection rewrites and bcd ca status reads for every connected agent. A refused report
// writes nothing: the row keeps the last one recorded.
func TestAgentCATrustBounds(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		fp, other := strings.Repeat("ab", 32), strings.Repeat("0f", 32)
		many := make([]string, 10000)
		for i := range many {
			many[i] = fp
		}
		for i, tc := range []struct {
			name    string
			trusted []string
			issuer  string
			ok      bool
		}{
			{"two fingerprints", []string{fp, other}, fp, true},
			{"none (an agent older than rotation)", nil, fp, true},
			{"eight", slices.Repeat([]string{fp}, store.MaxAgentCAs), fp, true},
			{"nine", slices.Repeat([]string{fp}, store.MaxAgentCAs+1), fp, false},
			{"thousands", many, fp, false},
			{"not hex", []string{strings.Repeat("zz", 32)}, fp, false},
			{"too long", []string{fp + "00"}, fp, false},
			{"empty", []string{""}, fp, false},
			{"upper case", []string{strings.ToUpper(fp)}, fp, false},
			{"text", []string{strings.Repeat("x", 1<<20)}, fp, false},
			{"issuer not hex", []string{fp}, "issuer", false},
		} {
			cas := store.AgentCAs{Trusted: tc.trusted, Issuer: tc.issuer}
			if err := cas.Check(); (err == nil) != tc.ok {
				t.Errorf("%s: Check = %v, want ok %v", tc.name, err, tc.ok)
			}
			// The connection's write, as the engine's gateway adapter makes it.
			recorded := store.AgentCAs{Trusted: []string{other}, Issuer: other}
			a := store.Agent{ID: "sa1", Kind: "site", SiteID: "s", ConnID: "c", CAs: &recorded}
			if err := st.Write(ctx, func(tx *store.Tx) error { return tx.UpsertAgent(ctx, a) }); err != nil {
				t.Fatal(err)
			}
			a.ConnID, a.CAs = "c"+string(rune('a'+i)), &cas
			err := st.Write(ctx, func(tx *store.Tx) error { return tx.UpsertAgent(ctx, a) })
			if (err == nil) != tc.ok {
				t.Errorf("%s: UpsertAgent = %v, want ok %v", tc.name, err, tc.ok)
			}
			got, err := st.ConnectedAgentsCATrust(ctx)
			if err != nil || len(got) != 1 {
				t.Fatalf("%s: listed %+v, %v", tc.name, got, err)
			}
			want := recorded
			if tc.ok {
				want = cas
			}
			if !slices.Equal(got[0].Trusted, want.Trusted) || got[0].CertIssuer != want.Issuer {
				t.Errorf("%s: recorded %d fingerprints and issuer %q; want %d and %q", tc.name, len(got[0].Trusted), got[0].CertIssuer, len(want.Trusted), want.Issuer)
			}
		}
	})
}
