// Package netboot decides what a machine that network-boots is told to do: boot entries, the
// iPXE script generated from them (a pure function), the HTTP handler that serves scripts,
// iPXE binaries, verified artifacts and node metadata, and the artifact cache behind it.
package netboot

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// Kind says what a boot entry makes a machine boot.
type Kind string

const (
	KindRamdisk  Kind = "ramdisk"  // kernel + initrd of the bcd ramdisk agent
	KindInstance Kind = "instance" // kernel + initrd of an installed instance (network boot of an OS)
	KindLocal    Kind = "local"    // leave iPXE and boot from the local disk
	KindSanboot  Kind = "sanboot"  // boot a cached ISO over HTTP with iPXE sanboot
	// KindDiscovery boots the ramdisk in discovery mode: no token, no identity; it reports its
	// self-asserted inventory to the site (acceptance flow). Never a MAC's entry: the site
	// agent serves it to machines with none when its discovery boot is on.
	KindDiscovery Kind = "discovery"
)

// LocalMethod is how a KindLocal entry hands the machine back to its disk.
type LocalMethod string

const (
	// LocalExit returns to the firmware, which tries its next boot device.
	LocalExit LocalMethod = "exit"
	// LocalSanbootDrive boots the first BIOS disk (sanboot --no-describe --drive 0x80).
	LocalSanbootDrive LocalMethod = "sanboot"
)

// Kernel command line keys the ramdisk (and the instance rejoin helper) read.
const (
	CmdlineGatewayKey = "bcd.gateway"
	CmdlineTokenKey   = "bcd.token"
	// CmdlineCAKey carries the control plane's CA certificate (PEM, base64url without padding)
	// that a ramdisk trusts before it has joined.
	CmdlineCAKey = "bcd.ca"
	// Discovery mode: bcd.mode=discovery, where to report (the site's DiscoveryPath) and the MAC
	// the machine booted with.
	CmdlineModeKey    = "bcd.mode"
	CmdlineReportKey  = "bcd.report"
	CmdlineBootMACKey = "bcd.bootmac"
	// CmdlineSiteKey is the site agent's boot HTTP URL (its base URL, as the machine reached
	// it) on a ramdisk's command line: boot.kexec points a cloud-init or Ignition guest at it
	// when its command names no guestSite. Outside the bcd. namespace on purpose: a ramdisk
	// from before it refuses unknown bcd.* keys but ignores other ones (the kernel hands them
	// to /init as environment).
	CmdlineSiteKey = "bcd_site"
)

// RamdiskHPAArg is on every ramdisk entry's command line (not a discovery's, not an instance's):
// libata removes an ATA disk's host protected area, so the kernel shows, and the wipe erases,
// the disk's native capacity. The removal is permanent (SET MAX ADDRESS, not volatile). libata is
// a module in Debian's kernel: the ramdisk's init hands it the command line's libata.* arguments
// as it loads it (initsys.ModuleParams), as modprobe does. A drive that keeps its area (not
// unlocked, or its max address frozen by the firmware) fails the wipe, saying so.
const RamdiskHPAArg = "libata.ignore_hpa=1"

// Limits on what an entry may carry.
const (
	maxExtraArgs   = 32
	maxArgLen      = 256
	maxCmdlineLen  = 2048 // x86 COMMAND_LINE_SIZE
	maxCALen       = 3072 // two P-256 CA certificates in PEM (a rotation of the agent CA), base64url; as the ramdisk accepts
	maxURLLen      = 1024
	minTokenLen    = 16
	maxTokenLen    = 512
	maxArtifactLen = 64
)

// Artifact is a file a machine downloads while booting. The site fetches URL into its cache and
// serves it only once the content hashed to SHA256; Name is what the machine calls it (the
// kernel's initrd= argument names the initrd by it).
type Artifact struct {
	Name   string // [A-Za-z0-9._-], 1..64, not starting with '.'
	URL    string // http or https origin the site fetches from
	SHA256 string // 64 lowercase hex digits
}

// Entry is the boot entry of one MAC, pushed by the control plane to the boot-lease holder.
type Entry struct {
	Kind Kind

	// KindRamdisk and KindInstance.
	Kernel     Artifact
	Initrd     Artifact
	GatewayURL string   // bcd.gateway=; required for ramdisk
	Token      string   // bcd.token= (one-time discovery token / instance token); required for ramdisk
	CA         string   // bcd.ca= (base64url of the CA PEM, no padding); optional
	ExtraArgs  []string // further kernel parameters, key or key=value, validated

	// KindLocal.
	Local LocalMethod

	// KindSanboot.
	ISO Artifact
}

// Artifacts lists the artifacts the entry needs in the site cache before it can boot.
func (e *Entry) Artifacts() []Artifact {
	switch e.Kind {
	case KindRamdisk, KindInstance, KindDiscovery:
		return []Artifact{e.Kernel, e.Initrd}
	case KindSanboot:
		return []Artifact{e.ISO}
	}
	return nil
}

// Validate checks every field the kind uses and that the fields it does not use are empty.
// Messages never contain the token.
func (e *Entry) Validate() error {
	switch e.Kind {
	case KindRamdisk, KindInstance, KindDiscovery:
		if err := e.Kernel.Validate(); err != nil {
			return fmt.Errorf("kernel: %w", err)
		}
		if err := e.Initrd.Validate(); err != nil {
			return fmt.Errorf("initrd: %w", err)
		}
		if e.Kernel.Name == e.Initrd.Name {
			return errors.New("kernel and initrd must have different names")
		}
		if e.Kind == KindRamdisk && (e.GatewayURL == "" || e.Token == "") {
			return errors.New("a ramdisk entry needs a gateway URL and a token")
		}
		if e.Kind == KindDiscovery && (e.GatewayURL == "" || e.Token != "") {
			return errors.New("a discovery entry needs a gateway URL and no token")
		}
		if e.Local != "" || e.ISO != (Artifact{}) {
			return fmt.Errorf("a %s entry carries no local method or ISO", e.Kind)
		}
		_, err := e.cmdline("")
		return err
	case KindLocal:
		if e.Local != LocalExit && e.Local != LocalSanbootDrive {
			return fmt.Errorf("local method %q: accepted are exit, sanboot", e.Local)
		}
		if e.hasBootFields() || e.ISO != (Artifact{}) {
			return errors.New("a local entry carries only its method")
		}
		return nil
	case KindSanboot:
		if err := e.ISO.Validate(); err != nil {
			return fmt.Errorf("iso: %w", err)
		}
		if e.hasBootFields() || e.Local != "" {
			return errors.New("a sanboot entry carries only its ISO")
		}
		return nil
	}
	return fmt.Errorf("entry kind %q: accepted are ramdisk, instance, local, sanboot, discovery", e.Kind)
}

func (e *Entry) hasBootFields() bool {
	return e.Kernel != (Artifact{}) || e.Initrd != (Artifact{}) || e.GatewayURL != "" || e.Token != "" || e.CA != "" || len(e.ExtraArgs) > 0
}

// cmdline builds the kernel arguments after the kernel URL: initrd=<name> first (gotcha: the
// 2019 iPXE with the EFI stub needs it), then gateway, token, CA, on a ramdisk's the HPA
// argument and the site's base URL (CmdlineSiteKey, when base is not ""; the site validated it
// with its ScriptParams), and the extra arguments. The site's URL is optional (a step's
// guestSite can stand in for it): a line that would pass the kernel's limit only with it goes
// without it, so an entry Validate accepted (without a base) always boots.
func (e *Entry) cmdline(base string) (string, error) {
	args := []string{"initrd=" + e.Initrd.Name}
	site := -1 // the site URL's index in args
	if e.GatewayURL != "" {
		if err := validateURL(e.GatewayURL); err != nil {
			return "", fmt.Errorf("gateway URL: %w", err)
		}
		args = append(args, CmdlineGatewayKey+"="+e.GatewayURL)
	}
	if e.Token != "" {
		if err := validateToken(e.Token); err != nil {
			return "", err
		}
		args = append(args, CmdlineTokenKey+"="+e.Token)
	}
	if e.CA != "" {
		if len(e.CA) > maxCALen {
			return "", fmt.Errorf("CA: %d characters, at most %d", len(e.CA), maxCALen)
		}
		for i := 0; i < len(e.CA); i++ {
			if c := e.CA[i]; !isAlnum(c) && c != '-' && c != '_' {
				return "", errors.New("CA: not base64url without padding")
			}
		}
		args = append(args, CmdlineCAKey+"="+e.CA)
	}
	if e.Kind == KindRamdisk {
		args = append(args, RamdiskHPAArg) // before the extra arguments, which may override it
		if base != "" {
			site = len(args)
			args = append(args, CmdlineSiteKey+"="+base)
		}
	}
	if len(e.ExtraArgs) > maxExtraArgs {
		return "", fmt.Errorf("%d extra kernel arguments: at most %d", len(e.ExtraArgs), maxExtraArgs)
	}
	for i, a := range e.ExtraArgs {
		if err := validateExtraArg(a); err != nil {
			return "", fmt.Errorf("extra kernel argument %d: %w", i, err)
		}
		args = append(args, a)
	}
	s := strings.Join(args, " ")
	if len(s) > maxCmdlineLen && site >= 0 {
		s = strings.Join(slices.Delete(args, site, site+1), " ")
	}
	if len(s) > maxCmdlineLen {
		if e.CA != "" {
			return "", fmt.Errorf("kernel command line of %d bytes: at most %d; bcd.ca takes %d of them (%s; during a rotation of the agent CA it holds two): shorten the ramdisk's extra arguments",
				len(s), maxCmdlineLen, len(CmdlineCAKey)+1+len(e.CA), caCount(e.CA))
		}
		return "", fmt.Errorf("kernel command line of %d bytes: at most %d", len(s), maxCmdlineLen)
	}
	return s, nil
}

// caCount says how many CA certificates a bcd.ca value (base64url of a PEM bundle) holds.
func caCount(enc string) string {
	raw, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return "a CA bundle"
	}
	if n := bytes.Count(raw, []byte("-----BEGIN CERTIFICATE-----")); n != 1 {
		return fmt.Sprintf("%d CA certificates", n)
	}
	return "1 CA certificate"
}

// Validate checks the artifact's name, URL and digest.
func (a Artifact) Validate() error {
	if err := validateArtifactName(a.Name); err != nil {
		return err
	}
	if err := validateURL(a.URL); err != nil {
		return fmt.Errorf("artifact %s URL: %w", a.Name, err)
	}
	if !IsSHA256(a.SHA256) {
		return fmt.Errorf("artifact %s: sha256 must be 64 lowercase hex digits", a.Name)
	}
	return nil
}

// IsSHA256 reports whether s is a lowercase hex SHA-256 digest.
func IsSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isHexLower(s[i]) {
			return false
		}
	}
	return true
}

func isHexLower(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func validateArtifactName(n string) error {
	if n == "" || len(n) > maxArtifactLen {
		return fmt.Errorf("artifact name must be 1..%d characters", maxArtifactLen)
	}
	if n[0] == '.' || n[0] == '-' {
		return fmt.Errorf("artifact name %q must start with a letter, digit or _", n)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return fmt.Errorf("artifact name %q: only letters, digits, '.', '_' and '-' are allowed", n)
		}
	}
	return nil
}

// urlSafe is the character set a URL may use inside an iPXE script or a kernel command line:
// no whitespace, quotes, '$', ';', '|', '&', '\', '#', '<', '>', '`', '{', '}' or control bytes,
// so nothing can start a new command, expand a setting or split an argument.
func urlSafe(c byte) bool {
	if isAlnum(c) {
		return true
	}
	switch c {
	case '.', '_', '~', '-', ':', '/', '?', '=', '%', '+', ',', '@', '[', ']':
		return true
	}
	return false
}

// validateURL accepts an absolute http(s) URL without user info, in the safe character set.
// Errors name no part of the URL (it may carry a signed query).
func validateURL(s string) error {
	if s == "" || len(s) > maxURLLen {
		return fmt.Errorf("URL must be 1..%d characters", maxURLLen)
	}
	for i := 0; i < len(s); i++ {
		if !urlSafe(s[i]) {
			return fmt.Errorf("URL contains a forbidden character at offset %d", i)
		}
	}
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("URL does not parse")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("URL scheme %q: only http and https", u.Scheme)
	}
	if u.Host == "" || u.User != nil || u.Opaque != "" {
		return errors.New("URL needs a host and no user info")
	}
	return nil
}

// validateToken accepts base64 / base64url / hex style tokens. The message never echoes it.
func validateToken(t string) error {
	if len(t) < minTokenLen || len(t) > maxTokenLen {
		return fmt.Errorf("token must be %d..%d characters", minTokenLen, maxTokenLen)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !isAlnum(c) && c != '-' && c != '_' && c != '.' && c != '~' && c != '+' && c != '/' && c != '=' {
			return errors.New("token contains a forbidden character")
		}
	}
	return nil
}

// reservedKeys are set by the entry itself; extra arguments cannot override them.
func reservedKey(k string) bool {
	return k == "initrd" || k == CmdlineGatewayKey || k == CmdlineTokenKey || k == CmdlineCAKey || k == CmdlineSiteKey || k == "BOOT_IMAGE"
}

func validateExtraArg(a string) error {
	if a == "" || len(a) > maxArgLen {
		return fmt.Errorf("must be 1..%d characters", maxArgLen)
	}
	key, val, hasVal := strings.Cut(a, "=")
	if key == "" {
		return errors.New("empty key")
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !isAlnum(c) && c != '_' && c != '.' && c != '-' {
			return fmt.Errorf("key %q: only letters, digits, '_', '.' and '-'", key)
		}
	}
	if reservedKey(key) {
		return fmt.Errorf("key %q is set by the entry itself", key)
	}
	if hasVal {
		for i := 0; i < len(val); i++ {
			c := val[i]
			if !isAlnum(c) && !strings.ContainsRune("._-,:/@+=%", rune(c)) {
				return fmt.Errorf("value of %q contains a forbidden character at offset %d", key, i)
			}
		}
	}
	return nil
}
