package netboot

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// Request is what a booting iPXE says about itself in the boot.ipxe query, validated.
type Request struct {
	MAC      net.HardwareAddr // 6 octets
	UUID     string           // canonical lowercase 8-4-4-4-12, or "" when the firmware has none
	Arch     string           // iPXE ${buildarch}: i386, x86_64, arm32, arm64, riscv32, riscv64, loong64
	Platform string           // iPXE ${platform}: pcbios, efi, or ""
}

const (
	maxQueryLen = 512
	maxParamLen = 64
)

// archs are the iPXE build architectures a request may name.
func validArch(a string) bool {
	switch a {
	case "i386", "x86_64", "arm32", "arm64", "riscv32", "riscv64", "loong64":
		return true
	}
	return false
}

func validPlatform(p string) bool { return p == "" || p == "pcbios" || p == "efi" }

// ParseQuery validates a raw boot.ipxe query string: mac (required, aa:bb:cc:dd:ee:ff), uuid
// (optional), arch or buildarch (required, one of the iPXE build architectures), platform
// (optional). Unknown or repeated parameters and over-long values are refused; error messages
// quote nothing from the query.
func ParseQuery(raw string) (Request, error) {
	if len(raw) > maxQueryLen {
		return Request{}, fmt.Errorf("query of %d bytes: at most %d", len(raw), maxQueryLen)
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return Request{}, fmt.Errorf("query does not parse")
	}
	get := func(k string) (string, error) {
		v := q[k]
		switch {
		case len(v) == 0:
			return "", nil
		case len(v) > 1:
			return "", fmt.Errorf("parameter %s given %d times", k, len(v))
		case len(v[0]) > maxParamLen:
			return "", fmt.Errorf("parameter %s longer than %d", k, maxParamLen)
		}
		return v[0], nil
	}
	for k := range q {
		switch k {
		case "mac", "uuid", "arch", "buildarch", "platform":
		default:
			return Request{}, fmt.Errorf("unknown parameter (%d bytes)", len(k))
		}
	}
	var r Request
	mac, err := get("mac")
	if err != nil {
		return Request{}, err
	}
	if r.MAC, err = ParseMAC(mac); err != nil {
		return Request{}, err
	}
	uuid, err := get("uuid")
	if err != nil {
		return Request{}, err
	}
	if r.UUID, err = ParseUUID(uuid); err != nil {
		return Request{}, err
	}
	arch, err := get("arch")
	if err != nil {
		return Request{}, err
	}
	barch, err := get("buildarch")
	if err != nil {
		return Request{}, err
	}
	switch {
	case arch == "":
		arch = barch
	case barch != "" && barch != arch:
		return Request{}, fmt.Errorf("arch and buildarch disagree")
	}
	if !validArch(arch) {
		return Request{}, fmt.Errorf("arch must be one of i386, x86_64, arm32, arm64, riscv32, riscv64, loong64")
	}
	r.Arch = arch
	if r.Platform, err = get("platform"); err != nil {
		return Request{}, err
	}
	if !validPlatform(r.Platform) {
		return Request{}, fmt.Errorf("platform must be pcbios or efi")
	}
	return r, nil
}

// ParseMAC accepts exactly six colon-separated two-digit hex octets (either case).
func ParseMAC(s string) (net.HardwareAddr, error) {
	if len(s) != 17 {
		return nil, fmt.Errorf("mac must be six colon-separated hex octets")
	}
	mac := make(net.HardwareAddr, 6)
	for i := range 6 {
		hi, ok1 := unhex(s[3*i])
		lo, ok2 := unhex(s[3*i+1])
		if !ok1 || !ok2 || (i < 5 && s[3*i+2] != ':') {
			return nil, fmt.Errorf("mac must be six colon-separated hex octets")
		}
		mac[i] = hi<<4 | lo
	}
	return mac, nil
}

// ParseUUID accepts "" or a UUID in 8-4-4-4-12 hex form and returns it lowercased.
func ParseUUID(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	if len(s) != 36 {
		return "", fmt.Errorf("uuid must be 8-4-4-4-12 hex digits")
	}
	for i := 0; i < len(s); i++ {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if s[i] != '-' {
				return "", fmt.Errorf("uuid must be 8-4-4-4-12 hex digits")
			}
			continue
		}
		if _, ok := unhex(s[i]); !ok {
			return "", fmt.Errorf("uuid must be 8-4-4-4-12 hex digits")
		}
	}
	return strings.ToLower(s), nil
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// Query renders the request back as a boot.ipxe query from its validated fields.
func (r Request) Query() string {
	var b strings.Builder
	b.WriteString("mac=" + r.MAC.String())
	if r.UUID != "" {
		b.WriteString("&uuid=" + r.UUID)
	}
	b.WriteString("&arch=" + r.Arch)
	if r.Platform != "" {
		b.WriteString("&platform=" + r.Platform)
	}
	return b.String()
}
