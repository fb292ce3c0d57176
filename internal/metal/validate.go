package metal

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"bcd/internal/bmc"
	"bcd/internal/bmc/redfish"
)

// InvalidError is bad input: which field, what was wrong and what is accepted.
type InvalidError struct {
	Field string
	Msg   string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Msg }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

var (
	nameRe     = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)
	labelKeyRe = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$`)
	labelValRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$|^$`)
	versionRe  = regexp.MustCompile(`^[!-~]([ -~]{0,61}[!-~])?$`)
	// A firmware component as BMCs name them (Redfish FirmwareInventory ids: BMC, BIOS,
	// Installed-25227-6.10.30.20__iDRAC.Embedded.1-1, NIC.Slot.1-1-1).
	componentRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/:+-]{0,61}[A-Za-z0-9])?$`)
	// A BIOS attribute as Redfish attribute registries name them (AttributeName), and its value
	// as text: printable ASCII, up to 255 characters, possibly empty.
	biosNameRe  = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,63}$`)
	biosValueRe = regexp.MustCompile(`^[ -~]{0,255}$`)
	hostRe      = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)
	hex64Re     = regexp.MustCompile(`^[0-9a-f]{64}$`)
	uuidRe      = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
)

const nameRule = "1-63 characters of a-z, 0-9, '.', '_' and '-', starting and ending with a letter or digit"

// ValidName checks a name (ValidLookupName adds what a new node, site, pool, tenant or token
// name needs).
func ValidName(field, s string) error {
	if !nameRe.MatchString(s) {
		if s == "" {
			return invalid(field, "is required (%s)", nameRule)
		}
		return invalid(field, "%q is not a valid name: use %s", truncate(s), nameRule)
	}
	return nil
}

// ValidLookupName checks the name of a new tenant, site, pool, API token or node: objects that
// are looked up by id or name. A name shaped like an id (a UUID, the form of every id the store
// makes) is refused: a lookup by another object's id could find the object so named instead,
// or a lookup by that name the other object.
func ValidLookupName(field, s string) error {
	if err := ValidName(field, s); err != nil {
		return err
	}
	if uuidRe.MatchString(s) {
		return invalid(field, "%q is shaped like an id (a UUID: 8-4-4-4-12 hex digits), and objects are looked up by id or name: "+
			"use %s, in any other form", s, nameRule)
	}
	return nil
}

// NormalizeMAC parses an Ethernet MAC in any common notation and returns it lower-case,
// colon-separated.
func NormalizeMAC(field, s string) (string, error) {
	hw, err := net.ParseMAC(strings.TrimSpace(s))
	if err != nil || len(hw) != 6 {
		return "", invalid(field, "%q is not an Ethernet MAC address: use six hex pairs such as 52:54:00:12:34:56", truncate(s))
	}
	if hw[0]&1 == 1 {
		return "", invalid(field, "%s is a multicast address: a NIC's MAC is unicast", hw)
	}
	if hw.String() == "00:00:00:00:00:00" {
		return "", invalid(field, "00:00:00:00:00:00 is not a NIC's MAC")
	}
	return hw.String(), nil
}

// NormalizeUUID checks a product (SMBIOS) UUID and returns it lower-case.
func NormalizeUUID(field, s string) (string, error) {
	u := strings.ToLower(strings.TrimSpace(s))
	if !uuidRe.MatchString(u) {
		return "", invalid(field, "%q is not a UUID: use the 8-4-4-4-12 hex form", truncate(s))
	}
	return u, nil
}

// ValidLabels checks label keys and values.
func ValidLabels(field string, labels map[string]string) error {
	if len(labels) > 64 {
		return invalid(field, "%d labels: at most 64 are accepted", len(labels))
	}
	for k, v := range labels {
		if !labelKeyRe.MatchString(k) {
			return invalid(field, "label key %q is not valid: use 1-63 characters of a-z, 0-9, '.', '_', '/' and '-'", truncate(k))
		}
		if !labelValRe.MatchString(v) {
			return invalid(field, "value of label %s is not valid: use up to 63 characters of A-Z, a-z, 0-9, '.', '_' and '-'", k)
		}
	}
	return nil
}

// MaxFirmwareBaseline bounds the components of a pool's firmware baseline, as labels are bounded.
const MaxFirmwareBaseline = 64

const (
	componentRule = "1-63 characters of A-Z, a-z, 0-9, '.', '_', '/', ':', '+' and '-', starting and ending with a letter or digit (as a Redfish firmware inventory id: BIOS, NIC.Slot.1-1-1)"
	versionRule   = "1-63 printable ASCII characters (letters, digits, spaces and punctuation, such as 2.17.1 or U46 v2.50 (03/01/2023)), " +
		"not starting or ending with a space"
)

// ValidFirmwareBaseline checks a pool policy's firmware baseline, component → the version it
// must run: at most MaxFirmwareBaseline components named as BMCs name them, each with a version of
// 1-63 printable ASCII characters. Components are checked in name order: the error names the
// first bad one.
func ValidFirmwareBaseline(field string, baseline map[string]string) error {
	if len(baseline) > MaxFirmwareBaseline {
		return invalid(field, "%d components: at most %d are accepted", len(baseline), MaxFirmwareBaseline)
	}
	for _, c := range slices.Sorted(maps.Keys(baseline)) {
		if !componentRe.MatchString(c) {
			return invalid(field, "component %q is not valid: use %s", truncate(c), componentRule)
		}
		if v := baseline[c]; !versionRe.MatchString(v) {
			return invalid(field, "required version %q of component %s is not valid: use %s", truncate(v), c, versionRule)
		}
	}
	return nil
}

const (
	biosNameRule  = "1-64 characters of A-Z, a-z, 0-9 and '_', starting with a letter (a Redfish BIOS attribute name: ProcVirtualization, SriovGlobalEnable)"
	biosValueRule = "0-255 printable ASCII characters, written as the BMC reports the value (Enabled, 42, true)"
)

// ValidBIOSSettings checks a pool policy's BIOS settings, attribute → value: at most
// bmc.MaxBIOSSettings attributes named as Redfish names them, each value printable text. A
// password attribute is refused: a pool's policy is shown to whoever reads the pool. Attributes
// are checked in name order: the error names the first bad one.
func ValidBIOSSettings(field string, settings map[string]string) error {
	if len(settings) > bmc.MaxBIOSSettings {
		return invalid(field, "%d attributes: at most %d are accepted", len(settings), bmc.MaxBIOSSettings)
	}
	for _, name := range slices.Sorted(maps.Keys(settings)) {
		if !biosNameRe.MatchString(name) {
			return invalid(field, "attribute %q is not valid: use %s", truncate(name), biosNameRule)
		}
		if strings.Contains(strings.ToLower(name), "password") {
			return invalid(field, "attribute %s is a password: BIOS passwords are secrets, and a pool's policy is shown to whoever reads the pool; set them out of band", name)
		}
		if !biosValueRe.MatchString(settings[name]) {
			return invalid(field, "value of attribute %s is not valid: use %s", name, biosValueRule)
		}
	}
	return nil
}

// MaxSelectors bounds the label selectors of one list or bulk: a node has at most 64 labels,
// so more selectors can only repeat one.
const MaxSelectors = 64

// ParseSelectors parses every key=value of field, at most MaxSelectors.
func ParseSelectors(field string, in []string) ([][2]string, error) {
	if len(in) > MaxSelectors {
		return nil, invalid(field, "%d selectors: at most %d are accepted", len(in), MaxSelectors)
	}
	out := make([][2]string, 0, len(in))
	for _, sel := range in {
		kv, err := ParseSelector(sel)
		if err != nil {
			return nil, err
		}
		out = append(out, kv)
	}
	return out, nil
}

// ParseSelector parses key=value.
func ParseSelector(s string) ([2]string, error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return [2]string{}, invalid("labels", "selector %q: use key=value", truncate(s))
	}
	if err := ValidLabels("labels", map[string]string{k: v}); err != nil {
		return [2]string{}, err
	}
	return [2]string{k, v}, nil
}

// Known BMC drivers.
var bmcDrivers = []string{"redfish", "ipmi"}

// ValidBMCAddress checks the address form each driver accepts: a URL for Redfish, host[:port]
// for IPMI.
func ValidBMCAddress(driver, addr string) (string, error) {
	addr = strings.TrimSpace(addr)
	if addr == "" {
		return "", invalid("bmc.address", "is required: https://HOST[:PORT] for redfish, HOST[:PORT] for ipmi")
	}
	if len(addr) > 255 {
		return "", invalid("bmc.address", "longer than 255 characters")
	}
	if strings.Contains(addr, "@") {
		// user[:password]@host: the address is not quoted back, it may hold the password.
		return "", invalid("bmc.address", "a BMC address must not carry credentials: give them with --bmc-username and --bmc-password-file")
	}
	if strings.ContainsAny(addr, "?#") {
		// A query or fragment (?password=…, ?X-Auth-Token=…): not quoted back either. Neither
		// driver's address has one.
		return "", invalid("bmc.address", "a BMC address is given without user or query: a query or fragment ('?', '#') may hold a credential; "+
			"use https://HOST[:PORT][%s/ID] for redfish, HOST[:PORT] for ipmi, and give credentials with --bmc-username and --bmc-password-file", redfish.SystemsCollection)
	}
	switch driver {
	case "redfish":
		u, err := url.Parse(addr)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return "", invalid("bmc.address", "%q is not a Redfish service address: use https://HOST[:PORT] (http:// only for labs), "+
				"optionally with the path %s/ID of the node's ComputerSystem, without user or query", truncate(addr), redfish.SystemsCollection)
		}
		if err := validHostPort(u.Host); err != nil {
			return "", err
		}
		// A path names the node's ComputerSystem on a BMC that serves several (a multi-node
		// chassis): the driver then acts on that one only and never guesses.
		system := ""
		if u.Path != "" && u.Path != "/" {
			if system, err = redfish.SystemPath(addr); err != nil || system == "" {
				return "", invalid("bmc.address", "path %q: give https://HOST[:PORT] without path, or with the path %s/ID naming the node's "+
					"ComputerSystem on a BMC that serves several (ID of letters, digits, '.', '_', '~' and '-')", truncate(u.Path), redfish.SystemsCollection)
			}
		}
		return u.Scheme + "://" + u.Host + system, nil
	case "ipmi":
		if strings.Contains(addr, "://") {
			return "", invalid("bmc.address", "%q: an IPMI address is HOST[:PORT] without a scheme", truncate(addr))
		}
		if err := validHostPort(addr); err != nil {
			return "", err
		}
		return addr, nil
	}
	// Not quoted: a secret pasted into the wrong field must not come back.
	return "", invalid("bmc.driver", "unknown driver: accepted are %s", strings.Join(bmcDrivers, ", "))
}

func validHostPort(hp string) error {
	host, port := hp, ""
	if h, p, err := net.SplitHostPort(hp); err == nil {
		host, port = h, p
	} else if strings.Count(hp, ":") > 1 && !strings.HasPrefix(hp, "[") {
		host = hp // bare IPv6
	}
	if port != "" {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return invalid("bmc.address", "port %q is not in 1-65535", truncate(port))
		}
	}
	host = strings.Trim(host, "[]")
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if !hostRe.MatchString(host) || len(host) > 253 {
		return invalid("bmc.address", "host %q is neither an IP address nor a DNS name", truncate(host))
	}
	return nil
}

// ValidBootMode checks a node's boot mode: uefi, legacy, or empty for the driver's behaviour.
func ValidBootMode(s string) (bmc.BootMode, error) {
	m, err := bmc.ParseBootMode(s)
	if err != nil {
		return "", invalid("boot_mode", "%q: accepted are uefi, legacy, or empty for the driver's behaviour "+
			"(Redfish leaves the mode as it is; IPMI keeps a pending override's mode, else writes UEFI)", truncate(s))
	}
	return m, nil
}

// ValidCredential checks a BMC username or password without echoing it.
func ValidCredential(field, s string, max int) error {
	if s == "" {
		return invalid(field, "is required")
	}
	if len(s) > max {
		return invalid(field, "is longer than %d bytes", max)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return invalid(field, "contains a control character")
		}
	}
	return nil
}

// NormalizeFingerprint accepts hex with or without colons.
func NormalizeFingerprint(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	f := strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), ":", ""))
	if !hex64Re.MatchString(f) {
		return "", invalid("bmc.tls_fingerprint_sha256", "is not a SHA-256 fingerprint: use 64 hex digits (colons allowed)")
	}
	return f, nil
}

// ValidReason bounds free text.
func ValidReason(s string) error {
	if len(s) > 1024 {
		return invalid("reason", "is longer than 1024 bytes")
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
