package sim

import "testing"

// The estimate lets 10 000 machines against a running server pass this kind of machine's hard
// limit of 20 000 open files, and stays above what 1 000 machines were measured to hold.
func TestOpenFilesEstimate(t *testing.T) {
	for _, tc := range []struct {
		n        int
		inProc   bool
		measured uint64 // peak measured (0: not)
		atMost   uint64
	}{
		{0, false, 0, 1024},
		{-5, true, 0, 1024},
		{1000, false, 1073, 3000},
		{1000, true, 2096, 4000},
		{10000, false, 0, 20000},
	} {
		got := OpenFiles(tc.n, tc.inProc)
		if got < tc.measured || got > tc.atMost {
			t.Errorf("OpenFiles(%d, %v) = %d, want between %d and %d", tc.n, tc.inProc, got, tc.measured, tc.atMost)
		}
	}
}
