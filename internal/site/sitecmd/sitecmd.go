// Package sitecmd is the `bcd site run` command: flags → site.Config → site agent.
package sitecmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"bcd/internal/dhcp"
	"bcd/internal/flagconfig"
	"bcd/internal/netboot"
	"bcd/internal/site"
)

// JoinTokenEnv is read when --join-token is not given (keeps the token out of ps).
const JoinTokenEnv = "BCD_SITE_JOIN_TOKEN"

// flags are the command's flags, as parsed.
type flags struct {
	server, site, joinToken, dataDir, caFile string
	dhcpMode, iface, serverIP, bootBinding   string
	httpListen, httpURL, tftpListen, ipxeDir string
	metricsListen                            string
	efiBinary, localBoot                     string
	dhcpPools, dhcpRouters, dhcpDNS          []string
	kernelURL, kernelSHA, initrdURL          string
	initrdSHA, ramdiskGateway                string
	ramdiskArgs                              []string
	leaseTTL, pollInterval, pollMax          time.Duration
	drainTimeout                             time.Duration
	pollParallel                             int
	noPowerPolling                           bool
	discoveryBoot                            bool
	cacheMax, cacheRetain                    string // "": the site agent's defaults
	logLevel                                 string
}

// Spec maps the flags of `bcd site run` to the environment: BCD_SITE_ and the flag's name in
// capitals, - as _ (--data-dir: BCD_SITE_DATA_DIR; --join-token: BCD_SITE_JOIN_TOKEN). Not BCD_
// alone: --server and --data-dir are also the CLI's and the control plane's flags, and a
// shell that exported BCD_SERVER (the API's URL) for the CLI would point the agent at the API.
// --join-token's value is never repeated in an error.
func Spec() flagconfig.Spec {
	return flagconfig.Spec{EnvPrefix: "BCD_SITE_", Secret: []string{"join-token"}}
}

// Command returns `run`, to be mounted under `bcd site`: it reads the process's environment
// and files.
func Command() *cobra.Command {
	return command(flagconfig.Source{Getenv: os.Getenv, ReadFile: os.ReadFile})
}

// command is `run` reading the environment and the config file from src.
func command(src flagconfig.Source) *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:   "run --server URL --site NAME --join-token TOKEN --data-dir DIR",
		Short: "Run a site agent: DHCP/TFTP/HTTP network boot and BMC drivers, dialling out to the control plane",
		Long: `Runs the site agent of one site. The first start joins with a one-time bootstrap token (` +
			"`bcd site join-token SITE`" + `; also read from $` + JoinTokenEnv + `) and keeps the agent's key and
certificate in the data dir; later starts reconnect with them (an agent whose certificate expired
while it was stopped joins again with a new token, keeping the data dir). Boot entries, DHCP leases and
the artifact cache live in the data dir too; the cache evicts what nothing uses, least recently used
first, beyond --cache-max, and once unused for --cache-retain.

Every flag can also come from the environment, BCD_SITE_ and its name in capitals with - as _
(BCD_SITE_DATA_DIR), or from the YAML file --config names (keys are the flags' names; lists take
YAML lists): a flag given wins over its variable, which wins over the file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := flagconfig.Apply(cmd.LocalFlags(), Spec(), src); err != nil {
				return err
			}
			cfg, err := f.config(src.ReadFile)
			if err != nil {
				return err
			}
			if cfg.Logger, err = logger(cmd.ErrOrStderr(), f.logLevel); err != nil {
				return err
			}
			if cfg.DHCPMode == dhcp.ModeFull {
				// Before it offers an address new to a client, the DHCP probes it: the agent that
				// held the boot lease before may have granted it without reporting it.
				p, err := dhcp.NewICMPProber(0)
				if err != nil {
					cfg.Logger.Warn("DHCP offers unprobed: an address the site's previous boot-lease holder granted in its last seconds may be offered again", "error", err)
				} else {
					defer p.Close()
					cfg.DHCPProbe = p
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return cfg.Run(ctx)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.server, "server", "", "agent gateway URL of the control plane (https://host:port)")
	fl.StringVar(&f.site, "site", "", "site this agent serves")
	fl.StringVar(&f.joinToken, "join-token", "", "one-time bootstrap token: at the first start, or to join again after the certificate expired (or $"+JoinTokenEnv+")")
	fl.StringVar(&f.dataDir, "data-dir", "/var/lib/bcd/site", "key, certificate, journal, boot entries, DHCP leases and artifact cache")
	fl.StringVar(&f.caFile, "ca-file", "", "PEM of the control plane's CA (first start only)")
	fl.StringVar(&f.dhcpMode, "dhcp", "off", "DHCP mode: off, proxy, full, or observe (answer nothing; learn which address each machine takes, for --boot-binding lease, beside a site DHCP server that does the network boot)")
	fl.StringVar(&f.bootBinding, "boot-binding", "", `to which address boot scripts (they carry one-time tokens) and /metadata go: "lease", only the one the agent's DHCP saw the MAC take (default with --dhcp proxy, full or observe), or "none", any (default with --dhcp off)`)
	fl.StringVar(&f.iface, "interface", "", "provisioning network interface (DHCP)")
	fl.StringVar(&f.serverIP, "server-ip", "", "this agent's IPv4 on the provisioning network (default: the interface's)")
	fl.StringVar(&f.httpListen, "http-listen", ":8080", "boot HTTP listen address")
	fl.StringVar(&f.httpURL, "http-url", "", "boot HTTP base URL as machines reach it (default from --http-listen / --server-ip)")
	fl.StringVar(&f.tftpListen, "tftp-listen", ":69", `TFTP listen address ("" disables)`)
	fl.StringVar(&f.metricsListen, "metrics-listen", site.DefaultMetricsListen, "address of /metrics (Prometheus) and /healthz; off: none")
	fl.StringVar(&f.ipxeDir, "ipxe-dir", site.DefaultIPXEDir, "iPXE binaries served over TFTP and HTTP")
	fl.StringVar(&f.efiBinary, "efi-binary", dhcp.BinaryEFI, "x86-64 UEFI iPXE binary: ipxe.efi or snponly.efi")
	fl.StringVar(&f.localBoot, "local-boot", "exit", "how local-boot entries leave iPXE: exit or sanboot")
	fl.StringArrayVar(&f.dhcpPools, "dhcp-pool", nil, "full DHCP: SUBNET,FIRST-LAST (e.g. 10.0.0.0/24,10.0.0.100-10.0.0.199); repeatable")
	fl.StringSliceVar(&f.dhcpRouters, "dhcp-router", nil, "full DHCP: router(s) to hand out")
	fl.StringSliceVar(&f.dhcpDNS, "dhcp-dns", nil, "full DHCP: DNS server(s) to hand out")
	fl.StringVar(&f.kernelURL, "ramdisk-kernel", "", "URL of the ramdisk kernel")
	fl.StringVar(&f.kernelSHA, "ramdisk-kernel-sha256", "", "SHA-256 of the ramdisk kernel")
	fl.StringVar(&f.initrdURL, "ramdisk-initrd", "", "URL of the ramdisk initramfs")
	fl.StringVar(&f.initrdSHA, "ramdisk-initrd-sha256", "", "SHA-256 of the ramdisk initramfs")
	fl.StringVar(&f.ramdiskGateway, "ramdisk-gateway", "", "gateway URL as booted machines reach it (default --server)")
	fl.StringSliceVar(&f.ramdiskArgs, "ramdisk-arg", nil, "extra kernel argument of ramdisk entries; repeatable")
	fl.DurationVar(&f.leaseTTL, "lease-ttl", site.DefaultLeaseTTL, "boot lease TTL: a dead holder is replaced within TTL + TTL/3")
	fl.DurationVar(&f.drainTimeout, "drain-timeout", site.DefaultDrainTimeout, "on stop (SIGTERM): how long the commands held may take to finish and be reported (new ones go to another agent); then what still runs is cancelled. 0: no drain")
	fl.DurationVar(&f.pollInterval, "power-poll-interval", time.Minute, "power polling: interval between two reads of a node whose BMC answers")
	fl.DurationVar(&f.pollMax, "power-poll-max-interval", 10*time.Minute, "power polling: ceiling of the back-off of a failing BMC")
	fl.IntVar(&f.pollParallel, "power-poll-parallel", 16, "power polling: reads in flight across all BMCs (one per BMC at most)")
	fl.BoolVar(&f.noPowerPolling, "no-power-polling", false, "do not poll power (the lease holder polls every node of the site otherwise)")
	fl.BoolVar(&f.discoveryBoot, "discovery-boot", false, "boot machines with no entry into the ramdisk in discovery mode (they report their inventory and wait for bcd node accept|reject); needs --ramdisk-*")
	fl.StringVar(&f.cacheMax, "cache-max", "20GiB", "artifact cache bound: beyond it, the least recently used artifacts nothing uses (no boot entry, virtual media, the ramdisk, a download) are evicted; bytes, or KiB, MiB, GiB, TiB. 0: no bound")
	fl.StringVar(&f.cacheRetain, "cache-retain", "7d", "artifact cache: an artifact nothing uses is evicted once unused this long, even under the bound; a duration (36h) or days (7d). 0: kept until the bound needs the room")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	flagconfig.AddConfigFlag(fl, Spec())
	return cmd
}

func logger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: accepted are debug, info, warn, error", level)
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})), nil
}

// config turns the flags into a site.Config. readFile reads --ca-file.
func (f flags) config(readFile func(string) ([]byte, error)) (site.Config, error) {
	cfg := site.Config{GatewayURL: f.server, Site: f.site, JoinToken: f.joinToken, DataDir: f.dataDir,
		HTTPListen: f.httpListen, HTTPBaseURL: f.httpURL, MetricsListen: f.metricsListen, TFTPListen: f.tftpListen, IPXEDir: f.ipxeDir,
		DHCPMode: dhcp.Mode(f.dhcpMode), BootBinding: site.BootBinding(f.bootBinding), Interface: f.iface, EFIBinary: f.efiBinary, LocalBoot: f.localBoot,
		LeaseTTL: f.leaseTTL, DrainTimeout: f.drainTimeout, AgentVersion: "bcd", NoPowerPolling: f.noPowerPolling,
		Poll: site.PollConfig{Interval: f.pollInterval, MaxInterval: f.pollMax, Parallel: f.pollParallel}}
	if f.server == "" || f.site == "" {
		return site.Config{}, errors.New("--server and --site are required")
	}
	switch {
	case f.drainTimeout < 0:
		return site.Config{}, fmt.Errorf("--drain-timeout %s: accepted is a duration of 0 (no drain) or more", f.drainTimeout)
	case f.drainTimeout == 0:
		cfg.DrainTimeout = -1 // no drain
	}
	if f.metricsListen != "off" && f.metricsListen != "" {
		if _, _, err := net.SplitHostPort(f.metricsListen); err != nil {
			return site.Config{}, fmt.Errorf("--metrics-listen %q: want HOST:PORT (e.g. %s, or :9481 for every address) or off", f.metricsListen, site.DefaultMetricsListen)
		}
	}
	if f.cacheMax != "" {
		n, err := ParseSize(f.cacheMax)
		if err != nil {
			return site.Config{}, fmt.Errorf("--cache-max: %w", err)
		}
		cfg.CacheBound = n
		if n == 0 {
			cfg.CacheBound = -1 // no bound
		}
	}
	if f.cacheRetain != "" {
		d, err := ParseRetain(f.cacheRetain)
		if err != nil {
			return site.Config{}, fmt.Errorf("--cache-retain: %w", err)
		}
		cfg.CacheRetain = d
		if d == 0 {
			cfg.CacheRetain = -1 // kept until the bound needs the room
		}
	}
	if f.caFile != "" {
		b, err := readFile(f.caFile)
		if err != nil {
			return site.Config{}, fmt.Errorf("reading --ca-file: %w", err)
		}
		cfg.CAPEM = b
	}
	if f.serverIP != "" {
		ip, err := netip.ParseAddr(f.serverIP)
		if err != nil || !ip.Is4() {
			return site.Config{}, fmt.Errorf("--server-ip %q is not an IPv4 address", f.serverIP)
		}
		cfg.ServerIP = ip
	}
	if f.kernelURL != "" || f.initrdURL != "" {
		cfg.Ramdisk = site.RamdiskConfig{
			Kernel:     netboot.Artifact{Name: "vmlinuz", URL: f.kernelURL, SHA256: strings.ToLower(f.kernelSHA)},
			Initrd:     netboot.Artifact{Name: "initrd.img", URL: f.initrdURL, SHA256: strings.ToLower(f.initrdSHA)},
			GatewayURL: f.ramdiskGateway, ExtraArgs: f.ramdiskArgs,
		}
		if _, err := site.RamdiskEntry(cfg.Ramdisk, strings.Repeat("x", 32)); err != nil {
			return site.Config{}, fmt.Errorf("--ramdisk-*: %w", err)
		}
	}
	if f.discoveryBoot {
		if f.kernelURL == "" || f.initrdURL == "" {
			return site.Config{}, errors.New("--discovery-boot needs the ramdisk (--ramdisk-kernel, --ramdisk-initrd and their sha256)")
		}
		cfg.DiscoveryBoot = true
	}
	routers, err := parseAddrs("--dhcp-router", f.dhcpRouters)
	if err != nil {
		return site.Config{}, err
	}
	dns, err := parseAddrs("--dhcp-dns", f.dhcpDNS)
	if err != nil {
		return site.Config{}, err
	}
	for _, p := range f.dhcpPools {
		pool, err := ParsePool(p)
		if err != nil {
			return site.Config{}, err
		}
		pool.Routers, pool.DNS = routers, dns
		cfg.DHCPPools = append(cfg.DHCPPools, pool)
	}
	if cfg.DHCPMode == dhcp.ModeFull && len(cfg.DHCPPools) == 0 {
		return site.Config{}, errors.New("--dhcp full needs at least one --dhcp-pool")
	}
	return cfg, nil
}

// ParseSize reads a byte count: a whole number of bytes, or one followed by KiB, MiB, GiB or
// TiB (binary units, as df -h counts; any case). Decimal units (GB) are refused: which one was
// meant is unclear.
func ParseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		shift  uint
	}{{"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}}
	num, shift := strings.TrimSpace(s), uint(0)
	for _, u := range units {
		if strings.HasSuffix(strings.ToLower(num), strings.ToLower(u.suffix)) {
			num, shift = strings.TrimSpace(num[:len(num)-len(u.suffix)]), u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a whole number of bytes, or of KiB, MiB, GiB or TiB (e.g. 20GiB)", s)
	}
	if n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return n << shift, nil
}

// ParseRetain reads a duration: Go's form (36h, 90m) or whole days (7d).
func ParseRetain(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n < 0 || n > math.MaxInt64/int64(24*time.Hour) {
			return 0, fmt.Errorf("duration %q: want whole days (7d) or a duration (36h)", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("duration %q: want whole days (7d) or a duration (36h) of 0 or more", s)
	}
	return d, nil
}

func parseAddrs(flag string, in []string) ([]netip.Addr, error) {
	out := make([]netip.Addr, 0, len(in))
	for _, s := range in {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return nil, fmt.Errorf("%s %q is not an IPv4 address", flag, s)
		}
		out = append(out, a)
	}
	return out, nil
}

// ParsePool reads SUBNET,FIRST-LAST.
func ParsePool(s string) (dhcp.Pool, error) {
	subnet, rng, ok := strings.Cut(s, ",")
	first, last, ok2 := strings.Cut(rng, "-")
	if !ok || !ok2 {
		return dhcp.Pool{}, fmt.Errorf("--dhcp-pool %q: want SUBNET,FIRST-LAST", s)
	}
	p, err := netip.ParsePrefix(strings.TrimSpace(subnet))
	if err != nil {
		return dhcp.Pool{}, fmt.Errorf("--dhcp-pool %q: subnet: %w", s, err)
	}
	a, err1 := netip.ParseAddr(strings.TrimSpace(first))
	b, err2 := netip.ParseAddr(strings.TrimSpace(last))
	if err1 != nil || err2 != nil || !p.Contains(a) || !p.Contains(b) || b.Less(a) {
		return dhcp.Pool{}, fmt.Errorf("--dhcp-pool %q: FIRST-LAST must be an ascending range inside the subnet", s)
	}
	return dhcp.Pool{Subnet: p.Masked(), Start: a, End: b}, nil
}

// Run runs `bcd site run` with args (for tests and embedding).
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := Command()
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	return cmd.ExecuteContext(ctx)
}
