package lab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Step is one action of the namespace's network setup: a sysctl write (Sysctl names the key
// under /proc/sys with slashes, e.g. net/ipv6/conf/all/accept_dad) or a command.
type Step struct {
	Sysctl string
	Value  string
	Argv   []string
}

func (s Step) String() string {
	if s.Sysctl != "" {
		return s.Sysctl + "=" + s.Value
	}
	return strings.Join(s.Argv, " ")
}

// NetworkSetup is what the supervisor does, inside the namespace, before starting the VMs:
// loopback up, no duplicate address detection (the bridge's addresses are usable at once, and
// so are the VMs' SLAAC addresses), the bridge with its IPv4 and IPv6 addresses, one tap per VM
// enslaved to it. The bridge forwards at once (forward_delay 0, no STP) and ignores router
// advertisements (it sends them). It is pure.
func NetworkSetup(s Spec) []Step {
	br := s.Bridge
	steps := []Step{
		{Argv: []string{"ip", "link", "set", "lo", "up"}},
		{Sysctl: "net/ipv6/conf/all/accept_dad", Value: "0"},
		{Sysctl: "net/ipv6/conf/default/accept_dad", Value: "0"},
		{Argv: []string{"ip", "link", "add", br, "type", "bridge", "forward_delay", "0", "stp_state", "0"}},
		{Sysctl: "net/ipv6/conf/" + br + "/accept_ra", Value: "0"},
		{Argv: []string{"ip", "addr", "add", s.BridgeIPv4.String(), "dev", br}},
		{Argv: []string{"ip", "addr", "add", s.BridgeIPv6.String(), "dev", br, "nodad"}},
		{Argv: []string{"ip", "link", "set", br, "up"}},
	}
	for _, vm := range s.VMs {
		steps = append(steps,
			Step{Argv: []string{"ip", "tuntap", "add", "dev", vm.Tap, "mode", "tap"}},
			Step{Argv: []string{"ip", "link", "set", vm.Tap, "master", br}},
			Step{Argv: []string{"ip", "link", "set", vm.Tap, "up"}},
		)
	}
	return steps
}

// NetworkTeardown undoes NetworkSetup's links (deleting the namespace would too; the supervisor
// cleans up after itself anyway). It is pure.
func NetworkTeardown(s Spec) []Step {
	var steps []Step
	for _, vm := range s.VMs {
		steps = append(steps, Step{Argv: []string{"ip", "link", "del", vm.Tap}})
	}
	return append(steps, Step{Argv: []string{"ip", "link", "del", s.Bridge}})
}

// runStep carries out one step in the calling process's network namespace.
func runStep(ctx context.Context, st Step) error {
	if st.Sysctl != "" {
		p := filepath.Join("/proc/sys", filepath.Clean("/"+st.Sysctl))
		if err := os.WriteFile(p, []byte(st.Value+"\n"), 0o644); err != nil {
			return fmt.Errorf("setting %s: %w", st, err)
		}
		return nil
	}
	out, err := exec.CommandContext(ctx, st.Argv[0], st.Argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("running %s: %w: %s", st, err, strings.TrimSpace(string(out)))
	}
	return nil
}
