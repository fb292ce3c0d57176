package sim

import "testing"

// The estimate lets 10 000 machines against a running server pass this kind of machine's hard
// limit of 20 000 open files, and stays above what 1 000 machines were measured to hold.
func TestOpenFilesEstimate(t *testing.T) {
	for _, tc := range []struct {
		n        int
		measured uint64 // peak measured (0: not)
		atMost   uint64
	}{
		{0, 0, 1024},
		{-5, 0, 1024},
		{1000, 1073, 3000},
		{10000, 0, 20000},
	} {
		got := OpenFiles(tc.n)
		if got < tc.measured || got > tc.atMost {
			t.Errorf("OpenFiles(%d) = %d, want between %d and %d", tc.n, got, tc.measured, tc.atMost)
		}
	}
}
