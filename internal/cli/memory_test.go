package cli

import (
	"strings"
	"testing"
)

// --memory-budget takes a size of 16 MiB or more, or 0; anything else is refused before the
// server or the simulation starts, saying what is accepted.
func TestMemoryBudgetRefusesBadSizes(t *testing.T) {
	for _, tc := range []struct {
		value, want string
	}{
		{"lots", "want a whole number of bytes, or of KiB, MiB, GiB or TiB"},
		{"192MB", "want a whole number of bytes, or of KiB, MiB, GiB or TiB"},
		{"-1", "want a whole number"},
		{"1MiB", "use 16MiB or more, or 0 for Go's default collector"},
	} {
		for _, args := range [][]string{
			{"server", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--gateway-listen", "off", "--memory-budget", tc.value},
			{"sim", "--nodes", "1", "--memory-budget", tc.value},
		} {
			code, _, errs := run(t, nil, args...)
			if code == 0 || !strings.Contains(errs, "--memory-budget") || !strings.Contains(errs, tc.want) {
				t.Errorf("%s --memory-budget %s: %d %q, want a refusal saying %q", args[0], tc.value, code, errs, tc.want)
			}
		}
	}
}
