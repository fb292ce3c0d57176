// Package agent is the bcd ramdisk agent. Start reads what the boot entry put on the kernel
// command line and gets an address by DHCP on every NIC with link; Run then joins the control
// plane through agentlink (key made in RAM, one-time token, CA from bcd.ca) and runs the
// commands it sends through Commands (inventory, wipe, image, kexec, diagnostics). In
// discovery mode (no token) it only reports its self-asserted inventory on the console and
// waits.
package agent

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"

	"bcd/internal/netboot"
)

// CmdlineModeKey selects discovery mode (bcd.mode=discovery) when the entry has no token.
const CmdlineModeKey = netboot.CmdlineModeKey

// Discovery mode: where the site takes the self-asserted inventory (bcd.report, the site's
// http URL) and the MAC the machine booted with (bcd.bootmac).
const (
	CmdlineReportKey  = netboot.CmdlineReportKey
	CmdlineBootMACKey = netboot.CmdlineBootMACKey
)

// CmdlineCAKey is netboot.CmdlineCAKey: the CA the ramdisk trusts before it has joined.
const CmdlineCAKey = netboot.CmdlineCAKey

// Mode is how the ramdisk presents itself to the gateway.
type Mode string

const (
	ModeJoin      Mode = "join"      // a one-time token from the boot entry
	ModeDiscovery Mode = "discovery" // no token, no identity: self-asserted inventory only
)

// Limits, the same as the boot entry's (netboot) so anything it writes is accepted here.
const (
	maxCmdline  = 4096
	maxURLLen   = 1024
	minTokenLen = 16
	maxTokenLen = 512
	maxCALen    = 3072 // encoded; a CA certificate and an intermediate fit
)

// BootParams is what the ramdisk learns from the kernel command line.
type BootParams struct {
	GatewayURL string
	Token      string // never logged: LogValue and String redact it
	Mode       Mode
	CAPEM      []byte // from bcd.ca; nil in discovery mode when not given
	// SiteURL is the site agent's boot HTTP URL (bcd_site, optional: a site agent from before
	// it sends none): where boot.kexec points a cloud-init or Ignition guest by default.
	SiteURL string
	// Discovery mode only (both or neither): where to report and the boot MAC.
	ReportURL string
	BootMAC   string
}

// LogValue keeps the token out of logs.
func (p BootParams) LogValue() slog.Value {
	return slog.GroupValue(slog.String("gateway", p.GatewayURL), slog.String("mode", string(p.Mode)),
		slog.Bool("token", p.Token != ""), slog.Bool("ca", len(p.CAPEM) > 0))
}

// String keeps the token out of %v.
func (p BootParams) String() string {
	return fmt.Sprintf("gateway=%s mode=%s token=%t", p.GatewayURL, p.Mode, p.Token != "")
}

// ParseCmdline reads bcd.gateway, bcd.token, bcd.ca, bcd.mode and bcd_site from a kernel command line
// (/proc/cmdline). Each key may appear once; the gateway is an http(s) URL in a safe
// character set; a token selects join mode, its absence needs bcd.mode=discovery. Join mode
// needs an https gateway and bcd.ca (the agent cannot join without a CA to trust). Error
// messages never contain the token, the URL or the CA.
func ParseCmdline(cmdline string) (BootParams, error) {
	if len(cmdline) > maxCmdline {
		return BootParams{}, fmt.Errorf("kernel command line of %d bytes: at most %d", len(cmdline), maxCmdline)
	}
	vals := map[string]string{}
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case netboot.CmdlineGatewayKey, netboot.CmdlineTokenKey, CmdlineModeKey, CmdlineCAKey, CmdlineReportKey, CmdlineBootMACKey, netboot.CmdlineSiteKey:
		default:
			if strings.HasPrefix(k, "bcd.") {
				return BootParams{}, fmt.Errorf("kernel command line: unknown key %q", safeKey(k))
			}
			continue
		}
		if _, dup := vals[k]; dup {
			return BootParams{}, fmt.Errorf("kernel command line: %s given twice", k)
		}
		vals[k] = v
	}
	p := BootParams{GatewayURL: vals[netboot.CmdlineGatewayKey], Token: vals[netboot.CmdlineTokenKey]}
	if p.GatewayURL == "" {
		return BootParams{}, fmt.Errorf("kernel command line: %s is missing", netboot.CmdlineGatewayKey)
	}
	if err := validateURL(p.GatewayURL); err != nil {
		return BootParams{}, fmt.Errorf("kernel command line: %s: %w", netboot.CmdlineGatewayKey, err)
	}
	mode, hasMode := vals[CmdlineModeKey]
	switch {
	case hasMode && mode != string(ModeDiscovery) && mode != string(ModeJoin):
		return BootParams{}, fmt.Errorf("kernel command line: %s must be %s or %s", CmdlineModeKey, ModeDiscovery, ModeJoin)
	case p.Token != "" && mode == string(ModeDiscovery):
		return BootParams{}, fmt.Errorf("kernel command line: a token and %s=%s together", CmdlineModeKey, ModeDiscovery)
	case p.Token != "":
		if err := validateToken(p.Token); err != nil {
			return BootParams{}, fmt.Errorf("kernel command line: %s: %w", netboot.CmdlineTokenKey, err)
		}
		p.Mode = ModeJoin
		if !strings.HasPrefix(p.GatewayURL, "https://") {
			return BootParams{}, fmt.Errorf("kernel command line: %s must be an https URL to join", netboot.CmdlineGatewayKey)
		}
		if _, ok := vals[CmdlineCAKey]; !ok {
			return BootParams{}, fmt.Errorf("kernel command line: %s is missing: no CA to trust for joining", CmdlineCAKey)
		}
	case mode == string(ModeDiscovery):
		p.Mode = ModeDiscovery
	default:
		return BootParams{}, fmt.Errorf("kernel command line: no %s and not %s=%s", netboot.CmdlineTokenKey, CmdlineModeKey, ModeDiscovery)
	}
	if site, ok := vals[netboot.CmdlineSiteKey]; ok {
		if err := validateURL(site); err != nil {
			return BootParams{}, fmt.Errorf("kernel command line: %s: %w", netboot.CmdlineSiteKey, err)
		}
		p.SiteURL = site
	}
	rep, hasRep := vals[CmdlineReportKey]
	mac, hasMAC := vals[CmdlineBootMACKey]
	switch {
	case (hasRep || hasMAC) && p.Mode != ModeDiscovery:
		return BootParams{}, fmt.Errorf("kernel command line: %s and %s are for %s=%s only", CmdlineReportKey, CmdlineBootMACKey, CmdlineModeKey, ModeDiscovery)
	case hasRep != hasMAC:
		return BootParams{}, fmt.Errorf("kernel command line: %s and %s go together", CmdlineReportKey, CmdlineBootMACKey)
	case hasRep:
		if err := validateURL(rep); err != nil {
			return BootParams{}, fmt.Errorf("kernel command line: %s: %w", CmdlineReportKey, err)
		}
		hw, err := netboot.ParseMAC(mac)
		if err != nil {
			return BootParams{}, fmt.Errorf("kernel command line: %s: %w", CmdlineBootMACKey, err)
		}
		p.ReportURL, p.BootMAC = rep, hw.String()
	}
	if enc, ok := vals[CmdlineCAKey]; ok {
		ca, err := DecodeCA(enc)
		if err != nil {
			return BootParams{}, fmt.Errorf("kernel command line: %s: %w", CmdlineCAKey, err)
		}
		p.CAPEM = ca
	}
	return p, nil
}

// EncodeCA is the bcd.ca value for a CA PEM: base64url without padding.
func EncodeCA(pem []byte) string { return base64.RawURLEncoding.EncodeToString(pem) }

// DecodeCA decodes and checks a bcd.ca value strictly: unpadded base64url (canonical), and
// PEM holding only CERTIFICATE blocks (at least one), each a parseable CA certificate, with
// nothing but whitespace around them. It returns the PEM. Errors never echo the value.
func DecodeCA(enc string) ([]byte, error) {
	if enc == "" || len(enc) > maxCALen {
		return nil, fmt.Errorf("must be 1..%d characters", maxCALen)
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(enc)
	if err != nil {
		return nil, errors.New("not unpadded base64url")
	}
	rest := raw
	n := 0
	for {
		rest = bytes.TrimLeft(rest, " \t\r\n")
		if len(rest) == 0 {
			break
		}
		if !bytes.HasPrefix(rest, []byte("-----BEGIN ")) {
			return nil, errors.New("data outside the PEM certificates")
		}
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			return nil, errors.New("a PEM block does not decode")
		}
		if b.Type != "CERTIFICATE" || len(b.Headers) > 0 {
			return nil, fmt.Errorf("PEM block %d is not a plain CERTIFICATE", n+1)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d does not parse: %w", n+1, err)
		}
		if !c.IsCA {
			return nil, fmt.Errorf("certificate %d is not a CA certificate", n+1)
		}
		n++
	}
	if n == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return raw, nil
}

// safeKey returns k when it is short and plain, else a placeholder, so an error never
// carries arbitrary bytes from the command line to the console.
func safeKey(k string) string {
	if len(k) > 32 {
		return "(long key)"
	}
	for i := 0; i < len(k); i++ {
		if !isAlnum(k[i]) && k[i] != '.' && k[i] != '_' && k[i] != '-' {
			return "(key with odd characters)"
		}
	}
	return k
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

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

// validateURL accepts an absolute http(s) URL with a host, no user info, in the character
// set the boot entry allows. Errors name no part of the URL.
func validateURL(s string) error {
	if len(s) > maxURLLen {
		return fmt.Errorf("URL longer than %d characters", maxURLLen)
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
		return errors.New("URL scheme must be http or https")
	}
	if u.Host == "" || u.User != nil || u.Opaque != "" || u.Hostname() == "" {
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
