package netboot

import (
	"slices"
	"strings"
	"testing"
)

// TestRamdiskHPAArg: a ramdisk entry's kernel command line makes libata remove an ATA disk's
// host protected area (so the wipe reaches the native capacity), before the extra arguments
// (which can override it); discovery and instance entries do not (they erase nothing, and the
// removal is permanent).
func TestRamdiskHPAArg(t *testing.T) {
	for _, tc := range []struct {
		kind Kind
		want bool
	}{
		{KindRamdisk, true},
		{KindDiscovery, false},
		{KindInstance, false},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			e := ramdiskEntry()
			e.Kind = tc.kind
			if tc.kind == KindDiscovery {
				e.Token = ""
			}
			line, err := e.cmdline("")
			if err != nil {
				t.Fatal(err)
			}
			args := strings.Fields(line)
			i := slices.Index(args, RamdiskHPAArg)
			if got := i >= 0; got != tc.want {
				t.Fatalf("%s in %q: %v, want %v", RamdiskHPAArg, line, got, tc.want)
			}
			if tc.want && i > slices.Index(args, e.ExtraArgs[0]) {
				t.Errorf("%s comes after the extra arguments in %q: they could not override it", RamdiskHPAArg, line)
			}
		})
	}
}
