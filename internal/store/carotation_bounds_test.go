package store_test

import (
	"context"
	"strings"
	"testing"

	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestAgentCATrustBounds: what an agent says of its CAs (its Hello, any agent's, a lessee's
// installed OS's included) is recorded only as hex SHA-256 fingerprints, a few of them: a Hello
// naming thousands, or text, is refused rather than written into the row every connection
// rewrites and bcd ca status reads for every connected agent.
func TestAgentCATrustBounds(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		fp := strings.Repeat("ab", 32)
		many := make([]string, 10000)
		for i := range many {
			many[i] = fp
		}
		for _, tc := range []struct {
			name    string
			trusted []string
			ok      bool
		}{
			{"two fingerprints", []string{fp, strings.Repeat("0f", 32)}, true},
			{"none (an agent older than rotation)", nil, true},
			{"thousands", many, false},
			{"not hex", []string{strings.Repeat("zz", 32)}, false},
			{"too long", []string{fp + "00"}, false},
			{"empty", []string{""}, false},
			{"upper case", []string{strings.ToUpper(fp)}, false},
			{"text", []string{strings.Repeat("x", 1<<20)}, false},
		} {
			err := st.SetAgentCATrust(ctx, "sa1", tc.trusted, fp, 1)
			if (err == nil) != tc.ok {
				t.Errorf("%s: SetAgentCATrust = %v, want ok %v", tc.name, err, tc.ok)
			}
		}
	})
}
