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
			checkArg(t, e, "", RamdiskHPAArg, tc.want)
		})
	}
}

// checkArg checks that e's command line (the site at base) holds arg exactly when want, and
// then before the extra arguments (which can override it); it returns the line.
func checkArg(t *testing.T, e Entry, base, arg string, want bool) string {
	t.Helper()
	line, err := e.cmdline(base)
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Fields(line)
	i := slices.Index(args, arg)
	if got := i >= 0; got != want {
		t.Fatalf("%s in %q: %v, want %v", arg, line, got, want)
	}
	if want && i > slices.Index(args, e.ExtraArgs[0]) {
		t.Errorf("%s comes after the extra arguments in %q: they could not override it", arg, line)
	}
	return line
}

// TestRamdiskSiteArg: a ramdisk's command line carries the site's URL (bcd_site) before the
// extra arguments, other entries' do not, and a line that fits the kernel's limit only without
// it boots without it (the URL is optional; an entry Validate accepted must boot).
func TestRamdiskSiteArg(t *testing.T) {
	const base = "http://10.0.0.1:8080"
	site := CmdlineSiteKey + "=" + base
	// pad makes extra arguments that leave room bytes below the limit before the site's URL.
	pad := func(t *testing.T, e Entry, room int) Entry {
		t.Helper()
		line, err := e.cmdline("")
		if err != nil {
			t.Fatal(err)
		}
		for n := maxCmdlineLen - room - len(line); n > 0; {
			a := "x=" + strings.Repeat("y", min(n-1, maxArgLen)-2)
			e.ExtraArgs = append(e.ExtraArgs, a)
			n -= len(a) + 1
		}
		if line, _ := e.cmdline(""); len(line) != maxCmdlineLen-room {
			t.Fatalf("padded to %d bytes, want %d", len(line), maxCmdlineLen-room)
		}
		return e
	}
	for _, tc := range []struct {
		name string
		kind Kind
		room int // bytes left below the limit without the site's URL; -1: no padding
		want bool
	}{
		{"ramdisk", KindRamdisk, -1, true},
		{"ramdisk, just room", KindRamdisk, len(site) + 1, true},
		{"ramdisk, a byte short", KindRamdisk, len(site), false},
		{"instance", KindInstance, -1, false},
		{"discovery", KindDiscovery, -1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := ramdiskEntry()
			e.Kind = tc.kind
			if tc.kind == KindDiscovery {
				e.Token = ""
			}
			if tc.room >= 0 {
				e = pad(t, e, tc.room)
			}
			if line := checkArg(t, e, base, site, tc.want); len(line) > maxCmdlineLen {
				t.Errorf("a command line of %d bytes", len(line))
			}
		})
	}
}
