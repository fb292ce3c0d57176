package netboot

import (
	"fmt"
	"strings"
	"time"
)

// HTTP paths the site serves. The DHCP side builds its URLs from them.
const (
	ScriptPath   = "/boot.ipxe"
	ArtifactPath = "/artifacts/" // + <sha256>/<name>
	BinaryPath   = "/ipxe/"      // + iPXE binary name
	MetadataPath = "/metadata"
	// DiscoveryPath receives a discovery-mode ramdisk's self-asserted inventory (POST, JSON).
	DiscoveryPath = "/discovery"
	// ScriptQuery is the query iPXE expands itself when it fetches the script named by DHCP.
	ScriptQuery = "mac=${net0/mac}&uuid=${uuid}&arch=${buildarch}"
)

// ScriptParams is what Script needs besides the entry and the request: where the site is.
type ScriptParams struct {
	BaseURL    string        // http://site:port, as the machines reach it
	RetryAfter time.Duration // how long a failed or waiting machine sleeps before re-chaining
}

func (p ScriptParams) check() error {
	if err := validateURL(p.BaseURL); err != nil {
		return fmt.Errorf("base URL: %w", err)
	}
	if strings.ContainsAny(p.BaseURL, "?") || strings.HasSuffix(p.BaseURL, "/") {
		return fmt.Errorf("base URL must have no query and no trailing slash")
	}
	if p.RetryAfter < time.Second || p.RetryAfter > time.Hour {
		return fmt.Errorf("retry delay %s: must be 1s..1h", p.RetryAfter)
	}
	return nil
}

func (p ScriptParams) artifactURL(a Artifact) string {
	return p.BaseURL + ArtifactPath + a.SHA256 + "/" + a.Name
}

func (p ScriptParams) selfURL(req Request) string {
	return p.BaseURL + ScriptPath + "?" + req.Query()
}

// Script renders the iPXE script that boots entry for the machine behind req. It is a pure
// function: every value it writes was validated (entry, request, params), so nothing from a
// request or an entry can add a command, expand an iPXE setting or split an argument.
// A nil entry gives the waiting script (see WaitScript).
func Script(entry *Entry, req Request, p ScriptParams) (string, error) {
	if err := p.check(); err != nil {
		return "", err
	}
	if err := req.check(); err != nil {
		return "", err
	}
	if entry == nil {
		return waitScript(req, p, "no boot entry for this machine"), nil
	}
	if err := entry.Validate(); err != nil {
		return "", fmt.Errorf("boot entry for %s: %w", req.MAC, err)
	}
	var b strings.Builder
	b.WriteString("#!ipxe\n")
	fmt.Fprintf(&b, "echo bcd: %s boot of %s\n", entry.Kind, req.MAC)
	switch entry.Kind {
	case KindRamdisk, KindInstance, KindDiscovery:
		cmdline, err := entry.cmdline(p.BaseURL)
		if err != nil {
			return "", err
		}
		if entry.Kind == KindDiscovery {
			// Validated values only: the site's base URL and the request's parsed MAC.
			cmdline += " " + CmdlineModeKey + "=discovery " + CmdlineReportKey + "=" + p.BaseURL + DiscoveryPath + " " + CmdlineBootMACKey + "=" + req.MAC.String()
		}
		fmt.Fprintf(&b, "kernel --name %s %s %s || goto failed\n", entry.Kernel.Name, p.artifactURL(entry.Kernel), cmdline)
		fmt.Fprintf(&b, "initrd --name %s %s || goto failed\n", entry.Initrd.Name, p.artifactURL(entry.Initrd))
		b.WriteString("boot || goto failed\n")
	case KindLocal:
		if entry.Local == LocalSanbootDrive {
			b.WriteString("sanboot --no-describe --drive 0x80 || goto failed\n")
		} else {
			b.WriteString("exit\n")
		}
	case KindSanboot:
		fmt.Fprintf(&b, "sanboot --no-describe %s || goto failed\n", p.artifactURL(entry.ISO))
	}
	b.WriteString(":failed\n")
	fmt.Fprintf(&b, "echo bcd: boot failed, retrying in %d s\n", int(p.RetryAfter/time.Second))
	fmt.Fprintf(&b, "sleep %d\n", int(p.RetryAfter/time.Second))
	fmt.Fprintf(&b, "chain --replace --autofree %s\n", p.selfURL(req))
	return b.String(), nil
}

// WaitScript renders a script that does not boot: it prints why, sleeps and fetches the script
// again. reason is one of the fixed messages of this package, never request data.
func WaitScript(req Request, p ScriptParams, reason WaitReason) (string, error) {
	if err := p.check(); err != nil {
		return "", err
	}
	if err := req.check(); err != nil {
		return "", err
	}
	return waitScript(req, p, string(reason)), nil
}

// WaitReason is a fixed message a waiting machine prints.
type WaitReason string

const (
	WaitNoEntry         WaitReason = "no boot entry for this machine"
	WaitArtifacts       WaitReason = "boot files are not in the site cache yet"
	WaitEntryUnbootable WaitReason = "the boot entry is invalid"
	// WaitAddress: the request did not come from the address the site's DHCP saw this MAC
	// take. The script asks DHCP again before it retries, so a machine whose binding the site
	// lost (an agent restarted in proxy mode, a new boot-lease holder) gets it back.
	WaitAddress WaitReason = "this request's address is not the one the site's DHCP saw this machine take"
)

func waitScript(req Request, p ScriptParams, reason string) string {
	secs := int(p.RetryAfter / time.Second)
	var b strings.Builder
	b.WriteString("#!ipxe\n")
	fmt.Fprintf(&b, "echo bcd: %s (%s), retrying in %d s\n", reason, req.MAC, secs)
	fmt.Fprintf(&b, "sleep %d\n", secs)
	if reason == string(WaitAddress) {
		b.WriteString("dhcp netX ||\n") // netX: the interface iPXE booted from
	}
	fmt.Fprintf(&b, "chain --replace --autofree %s\n", p.selfURL(req))
	return b.String()
}

// check re-validates a Request built by hand (ParseQuery already guarantees it).
func (r Request) check() error {
	if len(r.MAC) != 6 {
		return fmt.Errorf("request mac must have 6 octets")
	}
	if u, err := ParseUUID(r.UUID); err != nil || u != r.UUID {
		return fmt.Errorf("request uuid must be canonical lowercase")
	}
	if !validArch(r.Arch) {
		return fmt.Errorf("request arch invalid")
	}
	if !validPlatform(r.Platform) {
		return fmt.Errorf("request platform invalid")
	}
	return nil
}
