package agentlink

import "testing"

// TestCAMismatch: an agent renews when the control plane trusts other CAs than it does (in any
// order), or signs with another CA than its certificate's; never on an answer without CAs.
func TestCAMismatch(t *testing.T) {
	for _, tc := range []struct {
		name      string
		held      []string
		issuer    string
		trusted   []string
		active    string
		wantRenew bool
	}{
		{"steady, agreed", []string{"a"}, "a", []string{"a"}, "a", false},
		{"older control plane", []string{"a"}, "a", nil, "", false},
		{"staged: next CA not held", []string{"a"}, "a", []string{"a", "b"}, "a", true},
		{"staged: held", []string{"a", "b"}, "a", []string{"a", "b"}, "a", false},
		{"overlap: held in another order, old certificate", []string{"a", "b"}, "a", []string{"b", "a"}, "b", true},
		{"overlap: renewed", []string{"b", "a"}, "b", []string{"b", "a"}, "b", false},
		{"finished: previous still held", []string{"b", "a"}, "b", []string{"b"}, "b", true},
		{"finished: agreed", []string{"b"}, "b", []string{"b"}, "b", false},
	} {
		if got := caMismatch(tc.held, tc.issuer, tc.trusted, tc.active) != ""; got != tc.wantRenew {
			t.Errorf("%s: renew = %v, want %v", tc.name, got, tc.wantRenew)
		}
	}
}
