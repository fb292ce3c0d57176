package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"bcd/internal/agentlink"
)

// Console markers.
const (
	MarkerReady  = "bcd-ramdisk: ready"
	MarkerJoined = "bcd-ramdisk: joined"
)

// NIC is a network interface that may get a lease.
type NIC struct {
	Name  string
	Index int
	MAC   net.HardwareAddr
}

// Net is what start-up does to the network stack.
type Net interface {
	Interfaces() ([]NIC, error)
	LinkUp(name string) error
	Carrier(name string) (bool, error)
	AddAddress(index int, p netip.Prefix) error
	AddDefaultRoute(index int, gw netip.Addr) error
}

// DHCPClient obtains one lease on one interface.
type DHCPClient interface {
	Lease(ctx context.Context, ifname string, mac net.HardwareAddr) (Lease, error)
}

// NodeHints is what the ramdisk asserts about itself before it has an identity.
type NodeHints struct {
	MACs       []string
	Addresses  []string
	SystemUUID string
	Serial     string
	Vendor     string
	Product    string
}

// Config of the start-up.
type Config struct {
	Cmdline func() (string, error) // reads /proc/cmdline
	Net     Net
	DHCP    DHCPClient
	SysFS   fs.FS // /sys, for DMI hints; nil skips them

	LinkTimeout  time.Duration // wait for carrier per NIC; default 10 s
	DHCPTimeout  time.Duration // per attempt; default 15 s
	DHCPAttempts int           // per NIC and round; default 3
	RetryDelay   time.Duration // between rounds and join attempts (doubling, capped 30 s); default 2 s
	// DecisionPoll: how often a discovery-mode agent asks the site whether its machine was
	// accepted; default 5 s.
	DecisionPoll time.Duration

	// Commands runs what the control plane sends (Run only); nil: LinuxDeps().
	Commands *Commands
	// Link adjusts the agentlink configuration before dialing (tests: backoff, logger).
	Link func(*agentlink.Config)
}

func (c *Config) defaults() {
	if c.LinkTimeout <= 0 {
		c.LinkTimeout = 10 * time.Second
	}
	if c.DHCPTimeout <= 0 {
		c.DHCPTimeout = 15 * time.Second
	}
	if c.DHCPAttempts <= 0 {
		c.DHCPAttempts = 3
	}
	if c.RetryDelay <= 0 {
		c.RetryDelay = 2 * time.Second
	}
	if c.DecisionPoll <= 0 {
		c.DecisionPoll = 5 * time.Second
	}
}

// Session is the state start-up leaves behind.
type Session struct {
	Params BootParams
	Leases []Lease
	Hints  NodeHints
}

// Start reads the command line, brings the network up (retrying until ctx ends) and prints
// the ready marker. A bad command line is an error at once: retrying cannot fix it. Joining
// is Run's (agentlink makes the key in RAM and joins with the token).
func Start(ctx context.Context, console io.Writer, log *slog.Logger, cfg Config) (*Session, error) {
	cfg.defaults()
	line, err := cfg.Cmdline()
	if err != nil {
		return nil, fmt.Errorf("reading kernel command line: %w", err)
	}
	params, err := ParseCmdline(line)
	if err != nil {
		return nil, err
	}
	log.InfoContext(ctx, "boot parameters", "params", params)
	s := &Session{Params: params}
	if !randomReady() {
		fmt.Fprintln(console, "bcd-ramdisk: waiting for the kernel's random pool (no RDRAND or hardware RNG?)")
	}

	delay := cfg.RetryDelay
	for {
		s.Leases, err = ConfigureNetwork(ctx, log, cfg)
		if err == nil {
			break
		}
		fmt.Fprintf(console, "bcd-ramdisk: network not up yet (%v); retrying in %s\n", err, delay)
		if err := sleep(ctx, delay); err != nil {
			return nil, fmt.Errorf("bringing the network up: %w", err)
		}
		delay = min(delay*2, 30*time.Second)
	}

	s.Hints = gatherHints(cfg.SysFS, s.Leases, cfg.Net)
	addrs := make([]string, len(s.Leases))
	for i, l := range s.Leases {
		addrs[i] = l.Interface + ":" + l.Address.String()
	}
	fmt.Fprintf(console, "%s ip=%s gateway=%s mode=%s\n", MarkerReady, strings.Join(addrs, ","), params.GatewayURL, params.Mode)
	return s, nil
}

// ConfigureNetwork brings every NIC up, runs DHCP on those with carrier (in parallel, each
// with cfg.DHCPAttempts attempts of cfg.DHCPTimeout) and configures what was leased. The
// default route goes through the first NIC (in interface order) whose lease names a router.
// It fails when no NIC got a lease.
func ConfigureNetwork(ctx context.Context, log *slog.Logger, cfg Config) ([]Lease, error) {
	cfg.defaults()
	nics, err := cfg.Net.Interfaces()
	if err != nil {
		return nil, err
	}
	if len(nics) == 0 {
		return nil, errors.New("no network interfaces")
	}
	for _, n := range nics {
		if err := cfg.Net.LinkUp(n.Name); err != nil {
			log.WarnContext(ctx, "interface not brought up", "nic", n.Name, "err", err)
		}
	}
	leases := make([]*Lease, len(nics))
	errs := make([]error, len(nics))
	var wg sync.WaitGroup
	for i, n := range nics {
		wg.Go(func() {
			if err := waitCarrier(ctx, cfg.Net, n.Name, cfg.LinkTimeout); err != nil {
				errs[i] = err
				return
			}
			for a := 1; a <= cfg.DHCPAttempts; a++ {
				actx, cancel := context.WithTimeout(ctx, cfg.DHCPTimeout)
				l, err := cfg.DHCP.Lease(actx, n.Name, n.MAC)
				cancel()
				if err == nil {
					leases[i] = &l
					return
				}
				errs[i] = fmt.Errorf("attempt %d: %w", a, err)
				log.InfoContext(ctx, "no lease yet", "nic", n.Name, "attempt", a, "err", err)
				if ctx.Err() != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	var out []Lease
	routed := false
	for i, n := range nics {
		l := leases[i]
		if l == nil {
			continue
		}
		if err := cfg.Net.AddAddress(n.Index, l.Address); err != nil {
			errs[i] = err
			continue
		}
		if !routed && l.Router.IsValid() {
			if err := cfg.Net.AddDefaultRoute(n.Index, l.Router); err != nil {
				errs[i] = err
				continue
			}
			routed = true
		}
		log.InfoContext(ctx, "leased", "nic", n.Name, "address", l.Address, "router", l.Router, "server", l.Server)
		out = append(out, *l)
	}
	if len(out) == 0 {
		var all []error
		for i, e := range errs {
			if e != nil {
				all = append(all, fmt.Errorf("%s: %w", nics[i].Name, e))
			}
		}
		return nil, fmt.Errorf("no DHCP lease on any interface: %w", errors.Join(all...))
	}
	return out, nil
}

func waitCarrier(ctx context.Context, n Net, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		up, err := n.Carrier(name)
		if err == nil && up {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no link after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func gatherHints(sys fs.FS, leases []Lease, n Net) NodeHints {
	var h NodeHints
	if nics, err := n.Interfaces(); err == nil {
		for _, nic := range nics {
			h.MACs = append(h.MACs, nic.MAC.String())
		}
	}
	for _, l := range leases {
		h.Addresses = append(h.Addresses, l.Address.Addr().String())
	}
	if sys == nil {
		return h
	}
	read := func(name string) string {
		b, err := fs.ReadFile(sys, "class/dmi/id/"+name)
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	h.SystemUUID, h.Serial = read("product_uuid"), read("product_serial")
	h.Vendor, h.Product = read("sys_vendor"), read("product_name")
	return h
}

// randomReady reports whether getrandom would answer without blocking.
func randomReady() bool {
	var b [1]byte
	_, err := unix.Getrandom(b[:], unix.GRND_NONBLOCK)
	return err == nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
