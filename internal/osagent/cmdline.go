// Package osagent is the installed OS's agent of the lab OS image: bcd as PID 1 with
// bcd.role=os on the kernel command line. It gets an address by DHCP (the ramdisk agent's
// client), reads the node's metadata from the site agent (GET /metadata: node id, gateway URL,
// CA, one-time instance token; 404 until the control plane has prepared the instance), and joins
// the gateway as the node with the instance token and the capability engine.RoleOS, then stays
// connected. It keeps its identity on the image's FAT partition (so a reboot reconnects without
// a token) and runs no commands: everything the control plane sends is refused.
//
// It never gives up: every failure is printed on the console ("bcd os: …") and retried with
// doubling delays capped at MaxDelay.
package osagent

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"

	"bcd/internal/osagent/osjoin"
)

// Kernel command line keys.
const (
	CmdlineRoleKey     = "bcd.role"     // "os" selects this agent
	CmdlineMetadataKey = "bcd.metadata" // optional metadata URL; default http://<DHCP server>/metadata
	CmdlineStateKey    = "bcd.state"    // "partition": keep the identity on the image's partition
	RoleOS             = "os"
	StatePartition     = "partition"
	StateRAM           = "ram"
)

// Files on the image's FAT partition.
const (
	MarkerFile = "bcd-os.json" // marks the partition the agent keeps its state on
	StateDir   = "bcd-state"   // agentlink's data directory, created there at run time
)

// Console markers (the lab's end-to-end test reads the serial log).
const (
	MarkerStart  = "bcd os: starting"
	MarkerJoined = "bcd os: joined as node"
)

const maxCmdline = 4096

// Role returns the bcd.role value of a kernel command line ("" when absent).
func Role(cmdline string) string {
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, CmdlineRoleKey+"="); ok {
			return v
		}
	}
	return ""
}

// Params is what the OS agent reads from the kernel command line.
type Params struct {
	MetadataURL string // "" means http://<DHCP server identifier>/metadata
	// KeepIdentity (bcd.state=partition) keeps the identity on the image's FAT partition, so a
	// reboot reconnects without a token. Off by default: the disk then stays byte-identical to
	// the image, and every boot joins with the instance token the metadata holds.
	KeepIdentity bool
}

// ParseCmdline reads bcd.role (must be os), bcd.metadata (an http(s) URL with a host) and
// bcd.state (partition or ram). Other
// bcd.* keys are ignored (the boot entry may carry keys for other tools); each key once.
// Errors never echo values.
func ParseCmdline(cmdline string) (Params, error) {
	if len(cmdline) > maxCmdline {
		return Params{}, fmt.Errorf("kernel command line of %d bytes: at most %d", len(cmdline), maxCmdline)
	}
	seen := map[string]string{}
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		if k != CmdlineRoleKey && k != CmdlineMetadataKey && k != CmdlineStateKey {
			continue
		}
		if _, dup := seen[k]; dup {
			return Params{}, fmt.Errorf("kernel command line: %s given twice", k)
		}
		seen[k] = v
	}
	if seen[CmdlineRoleKey] != RoleOS {
		return Params{}, fmt.Errorf("kernel command line: %s=%s is required for the OS agent", CmdlineRoleKey, RoleOS)
	}
	p := Params{MetadataURL: seen[CmdlineMetadataKey]}
	switch st, ok := seen[CmdlineStateKey]; {
	case !ok || st == StateRAM:
	case st == StatePartition:
		p.KeepIdentity = true
	default:
		return Params{}, fmt.Errorf("kernel command line: %s must be %s or %s", CmdlineStateKey, StatePartition, StateRAM)
	}
	if _, ok := seen[CmdlineMetadataKey]; ok {
		if err := checkURL(p.MetadataURL, false); err != nil {
			return Params{}, fmt.Errorf("kernel command line: %s: %w", CmdlineMetadataKey, err)
		}
	}
	return p, nil
}

// checkURL is osjoin.CheckURL: the error names no part of the URL.
func checkURL(s string, httpsOnly bool) error { return osjoin.CheckURL(s, httpsOnly) }

// MetadataURL is the URL to read: the command line's, else http://<server>/metadata on port 80
// of the first lease that names a DHCP server.
func MetadataURL(p Params, servers []netip.Addr) (string, error) {
	if p.MetadataURL != "" {
		return p.MetadataURL, nil
	}
	for _, s := range servers {
		if s.IsValid() && !s.IsUnspecified() {
			return (&url.URL{Scheme: "http", Host: netip.AddrPortFrom(s.Unmap(), 80).String(), Path: "/metadata"}).String(), nil
		}
	}
	return "", fmt.Errorf("no %s on the kernel command line and no DHCP server identifier in any lease", CmdlineMetadataKey)
}
