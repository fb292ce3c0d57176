package cli

import (
	"testing"

	"bcd/internal/gen/bcdv1"
)

// The attestations table sums a wipe up: its disks, those that did not read back, and the
// devices it left alone.
func TestResultSummary(t *testing.T) {
	for _, tc := range []struct{ kind, result, want string }{
		{"disk.wipe", `{"disks":[{"name":"vda","verified":true},{"name":"vdb","verified":true}],"skipped":[]}`, "2 disks, every one read back"},
		{"disk.wipe", `{"disks":[{"name":"vda","verified":true},{"name":"vdb","verified":false}]}`, "2 disks, 1 did NOT read back"},
		{"disk.wipe", `{"disks":[{"name":"vda","verified":true}],"skipped":[{"name":"sr0","reason":"read-only"}]}`, "1 disks, every one read back (1 devices skipped: --save shows why)"},
		{"disk.wipe", `not json`, "not JSON"},
		{"diag.dcgm", `{"ok":true}`, "11 bytes"},
	} {
		if got := resultSummary(&bcdv1.Attestation{Kind: tc.kind, Result: tc.result}); got != tc.want {
			t.Errorf("%s %s: %q, want %q", tc.kind, tc.result, got, tc.want)
		}
	}
}
