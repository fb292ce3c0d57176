package kexec

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"bcd/internal/ramdisk/initsys"
)

// Guest says how the OS booted by the kexec finds the site's datasource, which makes it prove
// it booted (POST /rejoin, docs/drivers/cloud-init.md): boot.kexec's "guest" argument.
type Guest string

const (
	// GuestNone appends nothing: the lab image (its own agent rejoins), or an image that
	// already names the datasource itself.
	GuestNone Guest = "none"
	// GuestCloudInit: cloud-init's NoCloud datasource seeded from the site over HTTP.
	GuestCloudInit Guest = "cloud-init"
	// GuestIgnition: Ignition (Flatcar, Fedora CoreOS) fetching the site's config on a first
	// boot on bare metal.
	GuestIgnition Guest = "ignition"
)

// Guests are the accepted values, in the order error messages list them.
func Guests() []Guest { return []Guest{GuestNone, GuestCloudInit, GuestIgnition} }

// Site paths the guest arguments name (internal/netboot serves them: CloudInitPath,
// IgnitionPath; a test pins them equal).
const (
	cloudInitSeedPath = "/cloud-init/"
	ignitionPath      = "/ignition.json"
)

// ParseGuest reads a guest value; "" is GuestNone. The error lists the accepted values.
func ParseGuest(s string) (Guest, error) {
	if s == "" {
		return GuestNone, nil
	}
	if slices.Contains(Guests(), Guest(s)) {
		return Guest(s), nil
	}
	names := make([]string, len(Guests()))
	for i, g := range Guests() {
		names[i] = string(g)
	}
	return "", fmt.Errorf("guest %q: accepted are %s", s, strings.Join(names, ", "))
}

// GuestArgs are the kernel parameters that point guest at the site whose boot HTTP is site
// (http://host[:port], no path). Pure.
//
//   - cloud-init: ds=nocloud-net;s=SITE/cloud-init/ — the network NoCloud datasource (the
//     name every cloud-init release reads; 24.1+ also takes ds=nocloud with an http seed, and
//     calls nocloud-net deprecated). The ';' needs no quoting on a kernel command line given
//     to kexec_file_load (only a boot loader's shell-like config would need it quoted), and
//     the trailing '/' is required: cloud-init appends meta-data, user-data, vendor-data.
//   - ignition: ignition.config.url=SITE/ignition.json, ignition.platform.id=metal and the
//     first-boot flags the boot loader would otherwise set (Fedora CoreOS reads
//     ignition.firstboot, Flatcar flatcar.first_boot): a kexec skips the boot loader.
func GuestArgs(g Guest, site string) ([]string, error) {
	if g == GuestNone || g == "" {
		return nil, nil
	}
	if _, err := ParseGuest(string(g)); err != nil {
		return nil, err
	}
	if err := CheckSite(site); err != nil {
		return nil, err
	}
	switch g {
	case GuestCloudInit:
		return []string{"ds=nocloud-net;s=" + site + cloudInitSeedPath}, nil
	default: // GuestIgnition
		return []string{"ignition.firstboot", "flatcar.first_boot=detected", "ignition.platform.id=metal", "ignition.config.url=" + site + ignitionPath}, nil
	}
}

// CheckSite accepts http(s)://host[:port] with nothing a kernel parameter cannot carry
// unquoted (no space, quote or control character) and no path, query or user info.
func CheckSite(site string) error {
	if strings.ContainsFunc(site, func(r rune) bool { return r <= ' ' || r > '~' || r == '"' || r == '\'' || r == '\\' }) {
		return errors.New("the site URL holds a space, quote or non-printable character")
	}
	u, err := url.Parse(site)
	switch {
	case err != nil:
		return errors.New("the site URL does not parse")
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("the site URL must be http or https")
	case u.Host == "" || u.User != nil || u.Opaque != "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "":
		return errors.New("the site URL must be scheme://host[:port] with no path, query or user info")
	}
	return nil
}

// AppendArgs adds args to a kernel command line: each replaces every earlier parameter of the
// same key (what it sets must win, and the kernel and init see each key once), and any one
// already present as is is not added twice. Parameters are split as the kernel does: on
// spaces, a double-quoted part keeping its spaces. Pure.
func AppendArgs(cmdline string, args []string) string {
	if len(args) == 0 {
		return cmdline
	}
	keys := map[string]bool{}
	for _, a := range args {
		keys[paramKey(a)] = true
	}
	var out []string
	for _, p := range initsys.CmdlineWords(cmdline) {
		if !keys[paramKey(p)] {
			out = append(out, p)
		}
	}
	for _, a := range args {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return strings.Join(out, " ")
}

// paramKey is a parameter's key: before '=' (a quote before it does not count), the whole
// parameter when it has none.
func paramKey(p string) string {
	k, _, _ := strings.Cut(strings.ReplaceAll(p, `"`, ""), "=")
	return k
}
