// Package site is the site agent (`bcd site run`): it joins the control plane once with a
// bootstrap token, keeps its key and certificate in its data dir, dials out to the agent
// gateway (agentlink: reconnects, at-most-once journal), runs the site commands (BMC power,
// boot device and queries through a driver registry; boot entries) and serves network boot:
// the HTTP boot handler with its verified artifact cache, TFTP of the iPXE binaries and DHCP in
// the chosen mode, all under one errgroup.
//
// Several agents may serve one site. The control plane keeps the site's boot lease (through
// the gateway's BootLease call, renewed every TTL/3): only its holder answers DHCP and
// boot-script requests, receives the boot commands and polls power. The control plane keeps
// every node's boot entry as its last boot command left it and gives a new holder the whole
// table (with fresh one-time tokens), so when the holder dies another agent serves the machines
// waiting in PXE within the lease TTL plus one renewal period.
package site

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"bcd/internal/agentlink"
	"bcd/internal/bmc"
	"bcd/internal/bmc/ipmi"
	"bcd/internal/bmc/redfish"
	"bcd/internal/dhcp"
	"bcd/internal/gateway"
	"bcd/internal/netboot"
	"bcd/internal/tftp"
)

// Defaults.
const (
	DefaultLeaseTTL = 10 * time.Second
	// DefaultDrainTimeout bounds how long a stopping agent lets the commands it holds finish
	// (a slow BMC's power cycle takes tens of seconds; systemd's stop timeout is 90 s).
	DefaultDrainTimeout = 60 * time.Second
	DefaultIPXEDir      = "/usr/lib/ipxe"
	DefaultRetryAfter   = 5 * time.Second
	// dhcpRestartDelay is the wait before DHCP is started again after it failed while held.
	dhcpRestartDelay = 5 * time.Second
	// reportInterval spaces power reports to the control plane (readings are batched).
	reportInterval = 500 * time.Millisecond
	// statusMinInterval spaces status reports (discoveries come in bursts).
	statusMinInterval = 500 * time.Millisecond
	// DefaultCacheBound bounds the artifact cache: a ramdisk, a few OS images and ISOs (each
	// at most 8 GiB) fit, and it is a fixed number an operator can size the data dir's disk by.
	DefaultCacheBound = 20 << 30
	// DefaultCacheRetain keeps an artifact nothing uses for a week: an image replaced and
	// rolled back within days is not downloaded again.
	DefaultCacheRetain = 7 * 24 * time.Hour
	// DefaultCachePruneInterval spaces the cache's checks (it is also checked after each
	// download).
	DefaultCachePruneInterval = 15 * time.Minute
)

// Config configures a site agent. Zero values take the defaults.
type Config struct {
	// GatewayURL is https://host:port of the agent gateway (`--server`).
	GatewayURL string
	// Site is the site this agent serves; the certificate's site must match it.
	Site string
	// JoinToken is the one-time bootstrap token, used when DataDir holds no certificate yet.
	JoinToken string
	// DataDir holds the key, certificate, CA, command journal, boot entries, DHCP leases and the
	// artifact cache (under cache/).
	DataDir string
	// CAPEM is the control plane's CA, needed until the agent has joined.
	CAPEM []byte

	// HTTPListen is the boot HTTP address (default ":8080"); HTTPListener, when set, is used
	// instead (tests). HTTPBaseURL is how machines reach it (http://ip:port); default derived
	// from the listener, or from ServerIP when it listens on every address.
	HTTPListen   string
	HTTPListener net.Listener
	HTTPBaseURL  string
	// Bounds of the boot HTTP server (zero: the defaults): connections open at once
	// (DefaultHTTPMaxConns), keep-alive idleness (DefaultHTTPIdleTimeout), the read of a
	// request's body (DefaultHTTPBodyTimeout) and a response's write that makes no progress
	// (DefaultHTTPWriteTimeout).
	HTTPMaxConns     int
	HTTPIdleTimeout  time.Duration
	HTTPBodyTimeout  time.Duration
	HTTPWriteTimeout time.Duration
	// TFTPListen serves IPXEDir over TFTP ("" disables; the CLI defaults to ":69"); TFTPConn,
	// when set, is used instead.
	TFTPListen string
	TFTPConn   net.PacketConn
	IPXEDir    string // default /usr/lib/ipxe; also served over HTTP under /ipxe/
	// DHCP: mode off (default), proxy, full or observe (answers nothing: learns the addresses
	// clients take, for the boot binding); Interface is the provisioning interface and
	// ServerIP our IPv4 on it (default: the interface's first IPv4).
	DHCPMode  dhcp.Mode
	Interface string
	ServerIP  netip.Addr
	DHCPPools []dhcp.Pool
	// DHCPProbe (full mode) is asked whether an address answers on the network before it is
	// offered to a client it is new to, for a lease time after the agent's DHCP starts
	// (dhcp.Config.Probe): the agent that held the boot lease before may have granted leases
	// it never reported. nil: no probing. bcd site run opens an ICMP prober.
	DHCPProbe dhcp.Prober
	EFIBinary string // default ipxe.efi
	// BootBinding: to which address boot scripts and metadata go (see BootBinding); default
	// lease when DHCPMode is proxy, full or observe, none when it is off.
	BootBinding BootBinding
	RetryAfter  time.Duration
	Ramdisk     RamdiskConfig
	// DiscoveryBoot boots machines with no entry into the ramdisk in discovery mode (no token,
	// no identity; they report their self-asserted inventory and wait: the acceptance flow)
	// instead of letting them wait in iPXE. Needs Ramdisk. Without it the agent refuses
	// discovery reports (POST /discovery: 404).
	DiscoveryBoot bool
	LocalBoot     string // default local-boot method: exit (default) or sanboot

	// The artifact cache (DataDir/cache) keeps what the boot entries, the ISOs handed to BMCs'
	// virtual media, the ramdisk (Ramdisk: every ramdisk entry and the discovery boot use it)
	// and the downloads in progress use. Of the other artifacts it evicts, least recently used
	// first, while it holds more than CacheBound bytes (0: DefaultCacheBound; negative: no
	// bound), and those unused for CacheRetain (0: DefaultCacheRetain; negative: kept until the
	// bound needs their room). It is checked every CachePruneInterval (0:
	// DefaultCachePruneInterval) and after each download.
	CacheBound         int64
	CacheRetain        time.Duration
	CachePruneInterval time.Duration
	// ArtifactCache, when set, is used instead (tests); its own CacheConfig bounds it, and the
	// agent prunes it with its own references: do not share a bounded one between agents.
	ArtifactCache *netboot.Cache

	// Lease is the site's boot lease; nil takes the control plane's (BootLease through the
	// gateway: the holder is given the site's boot entries), or makes this agent the only one,
	// always the holder, when the control plane keeps none.
	Lease    Lease
	LeaseTTL time.Duration
	// DrainTimeout bounds, on a clean stop, the wait for the commands running to finish and
	// their results to reach the control plane (agentlink.Link.Drain); new commands go to
	// another agent meanwhile, and none held is started. What is still running then is
	// cancelled (reported interrupted). 0: DefaultDrainTimeout; negative: no drain.
	DrainTimeout time.Duration

	// Drivers replaces the BMC driver registry (tests); nil builds redfish and ipmi with
	// RedfishOptions, IPMIOptions and one Pacer (IPMIPacer) shared by every IPMI call.
	Drivers        map[string]DriverFactory
	RedfishOptions redfish.Options
	IPMIOptions    ipmi.Options
	IPMIPacer      ipmi.PacerConfig

	// Power-state polling, tuned by Poll. With the control plane's lease (Lease nil) the holder
	// polls the nodes of the control plane's poll set and reports to it; PowerReporter, when
	// set, receives the readings instead (and, with a Lease of its own or a control plane that
	// keeps none, the agent polls every node it ran a BMC command for).
	PowerReporter PowerReporter
	Poll          PollConfig
	// NoPowerPolling turns polling off.
	NoPowerPolling bool

	// Link tuning (tests); zero takes agentlink's defaults.
	HeartbeatInterval time.Duration
	MinBackoff        time.Duration
	MaxBackoff        time.Duration

	// MetricsListen is where /metrics (Prometheus) and /healthz are served ("" or "off": not
	// at all, and nothing is counted; the CLI defaults to DefaultMetricsListen);
	// MetricsListener, when set, is used instead (tests).
	MetricsListen   string
	MetricsListener net.Listener

	AgentVersion string
	Logger       *slog.Logger
	Now          func() time.Time
}

// Run builds the agent and runs it until ctx ends.
func (c Config) Run(ctx context.Context) error {
	a, err := New(c)
	if err != nil {
		return err
	}
	return a.Run(ctx)
}

// Agent is a site agent built from a Config.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	entries *Entries
	mounts  *mediaMounts
	cache   *netboot.Cache
	disc    *discoveries
	hold    *holdState
	handler *handler
	drivers map[string]DriverFactory
	httpLn  net.Listener
	tftpC   net.PacketConn
	baseURL string
	dirty   chan struct{}
	poller  *poller
	// metrics: what the agent counts, served on metricsLn; nil when it serves no metrics.
	metrics   *metrics
	metricsLn net.Listener

	linkReady chan struct{}
	linkMu    sync.Mutex
	link      *agentlink.Link
	bg        sync.WaitGroup // background fetches of artifacts (pushed entries, discovery boot), the cache's pruning
	// fetching: the digests a keepFetching loop runs for, with the reasons to fetch each and
	// what says whether each still holds; fetchRetry is the loops' first wait (0:
	// fetchRetryMin).
	fetchMu    sync.Mutex
	fetching   map[string]*fetchLoop
	fetchRetry time.Duration

	// rejected: MACs an operator rejected, as the control plane last told the holder
	// (netboot's decision answer to waiting discovery-mode ramdisks).
	rejected atomic.Pointer[map[string]bool]
	// Full DHCP across the site's agents: the lease changes this agent's DHCP made, for the
	// control plane, and the leases it gave this agent when it took the boot lease.
	dhcpReports *dhcpReports
	dhcpKnown   atomic.Pointer[[]dhcp.Lease]
	// withheld: boot scripts the boot binding withheld, for the status reports.
	withheld *withheldBoots
}

// setKnownLeases keeps the site's DHCP leases the control plane gave this agent with the boot
// lease; its DHCP, started once it serves, merges them with its own.
func (a *Agent) setKnownLeases(ls []gateway.DHCPLease) {
	out := make([]dhcp.Lease, 0, len(ls))
	for _, l := range ls {
		out = append(out, dhcp.Lease{MAC: l.MAC, IP: l.IP, Expires: l.Expires})
	}
	a.dhcpKnown.Store(&out)
}

// observeDHCP is the DHCP service's Observe: the boot binding, and the lease changes to report.
func (a *Agent) observeDHCP(b dhcp.Binding) {
	a.entries.Observe(b)
	if a.dhcpReports != nil {
		a.dhcpReports.observe(b)
	}
}

// setRejected keeps the rejected MACs the control plane sent with the boot lease.
func (a *Agent) setRejected(macs []string) {
	m := make(map[string]bool, len(macs))
	for _, s := range macs {
		if hw, err := net.ParseMAC(s); err == nil {
			m[hw.String()] = true
		}
	}
	a.rejected.Store(&m)
}

// Rejected implements netboot.RejectionLookup.
func (a *Agent) Rejected(_ context.Context, mac net.HardwareAddr) bool {
	m := a.rejected.Load()
	return m != nil && (*m)[mac.String()]
}

// New validates cfg, opens the data dir (boot entries, artifact cache) and binds the HTTP and
// TFTP sockets, so that their addresses are known before Run.
func New(cfg Config) (*Agent, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, hold: newHoldState(cfg.Now), dirty: make(chan struct{}, 1),
		linkReady: make(chan struct{})}
	var err error
	if a.entries, err = OpenEntries(cfg.DataDir, cfg.Ramdisk.GatewayURL, cfg.Ramdisk.CAPEM); err != nil {
		return nil, fmt.Errorf("starting site agent: %w", err)
	}
	a.entries.now = cfg.Now
	if cfg.Ramdisk.CA != nil {
		a.entries.FollowCA(cfg.Ramdisk.CA)
	}
	if cfg.DHCPMode == dhcp.ModeFull {
		a.dhcpReports = newDHCPReports()
	}
	if a.mounts, err = openMediaMounts(cfg.DataDir); err != nil {
		return nil, fmt.Errorf("starting site agent: %w", err)
	}
	a.cache = cfg.ArtifactCache
	if a.cache == nil {
		if a.cache, err = netboot.NewCache(netboot.CacheConfig{Dir: filepath.Join(cfg.DataDir, "cache"), Logger: cfg.Logger,
			Bound: max(cfg.CacheBound, 0), Retain: max(cfg.CacheRetain, 0), Now: cfg.Now}); err != nil {
			return nil, fmt.Errorf("starting site agent: %w", err)
		}
	}
	a.drivers = cfg.Drivers
	if a.drivers == nil {
		a.drivers = builtinDrivers(cfg.RedfishOptions, cfg.IPMIOptions, ipmi.NewPacer(cfg.IPMIPacer))
	}
	a.disc = newDiscoveries(a.entries.Has, a.poke)
	a.withheld = newWithheldBoots(a.poke)
	if a.metricsLn = cfg.MetricsListener; a.metricsLn == nil {
		if a.metricsLn, err = listenMetrics(cfg.MetricsListen); err != nil {
			a.closeAll()
			return nil, fmt.Errorf("starting site agent: %w", err)
		}
	}
	locks := newBMCLocks()
	deps := handlerDeps{drivers: a.drivers, locks: locks, entries: a.entries, mounts: a.mounts, cache: a.cache,
		ramdisk: cfg.Ramdisk, local: cfg.LocalBoot, key: a.key, changed: a.poke, log: cfg.Logger,
		console: func(ctx context.Context, id string) (ConsoleConn, error) {
			l, err := a.Link(ctx)
			if err != nil {
				return nil, err
			}
			return l.Console(ctx, id)
		}}
	var h *handler
	if !cfg.NoPowerPolling && (cfg.PowerReporter != nil || cfg.Lease == nil) {
		a.poller = newPoller(cfg.Poll, func(ctx context.Context, ref BMCRef, jwe string) (bmc.PowerState, error) {
			p, err := h.readPower(ctx, ref, jwe)
			a.metrics.powerPoll(err)
			return p, err
		}, locks, cfg.PowerReporter, cfg.Logger, cfg.Now)
		deps.watch = a.poller.Watch
	}
	h = newHandler(deps)
	a.handler = h
	if a.metricsLn != nil {
		a.metrics = newMetrics(agentView{dhcpMode: cfg.DHCPMode, kinds: h.Kinds(), drivers: driverNames(a.drivers), cache: a.cache,
			entries: a.entries.Len, held: a.hold.Held, sessions: a.sessions, connected: a.connected, journal: func() string { return journalPath(cfg.DataDir) }})
		h.metrics = a.metrics
	}

	a.httpLn = cfg.HTTPListener
	if a.httpLn == nil {
		if a.httpLn, err = net.Listen("tcp", cfg.HTTPListen); err != nil {
			a.closeAll()
			return nil, fmt.Errorf("starting site agent: listening for boot HTTP on %s: %w", cfg.HTTPListen, err)
		}
	}
	if a.baseURL, err = BaseURL(cfg.HTTPBaseURL, a.httpLn.Addr(), cfg.ServerIP); err != nil {
		a.closeAll()
		return nil, fmt.Errorf("starting site agent: %w", err)
	}
	h.baseURL = a.baseURL
	a.tftpC = cfg.TFTPConn
	if a.tftpC == nil && cfg.TFTPListen != "" {
		if a.tftpC, err = net.ListenPacket("udp4", cfg.TFTPListen); err != nil {
			a.closeAll()
			return nil, fmt.Errorf("starting site agent: listening for TFTP on %s: %w", cfg.TFTPListen, err)
		}
	}
	return a, nil
}

func (c *Config) setDefaults() error {
	switch {
	case c.GatewayURL == "":
		return errors.New("configuring site agent: the gateway URL (--server) is required")
	case c.Site == "":
		return errors.New("configuring site agent: the site (--site) is required")
	case c.DataDir == "":
		return errors.New("configuring site agent: a data dir (--data-dir) is required: it keeps the agent's key and boot entries")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.HTTPListen == "" {
		c.HTTPListen = ":8080"
	}
	if c.HTTPMaxConns <= 0 {
		c.HTTPMaxConns = DefaultHTTPMaxConns
	}
	if c.HTTPIdleTimeout <= 0 {
		c.HTTPIdleTimeout = DefaultHTTPIdleTimeout
	}
	if c.HTTPBodyTimeout <= 0 {
		c.HTTPBodyTimeout = DefaultHTTPBodyTimeout
	}
	if c.HTTPWriteTimeout <= 0 {
		c.HTTPWriteTimeout = DefaultHTTPWriteTimeout
	}
	if c.IPXEDir == "" {
		c.IPXEDir = DefaultIPXEDir
	}
	if c.DHCPMode == "" {
		c.DHCPMode = dhcp.ModeOff
	}
	switch c.DHCPMode {
	case dhcp.ModeOff, dhcp.ModeProxy, dhcp.ModeFull, dhcp.ModeObserve:
	default:
		return fmt.Errorf("configuring site agent: DHCP mode %q: accepted are off, proxy, full, observe", c.DHCPMode)
	}
	if c.EFIBinary == "" {
		c.EFIBinary = dhcp.BinaryEFI
	}
	b, err := checkBootBinding(c.BootBinding, c.DHCPMode != dhcp.ModeOff)
	if err != nil {
		return fmt.Errorf("configuring site agent: %w", err)
	}
	c.BootBinding = b
	if c.RetryAfter == 0 {
		c.RetryAfter = DefaultRetryAfter
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.CacheBound == 0 {
		c.CacheBound = DefaultCacheBound
	}
	if c.CacheRetain == 0 {
		c.CacheRetain = DefaultCacheRetain
	}
	if c.CachePruneInterval <= 0 {
		c.CachePruneInterval = DefaultCachePruneInterval
	}
	if c.LeaseTTL < 300*time.Millisecond {
		return fmt.Errorf("configuring site agent: lease TTL %s is too short", c.LeaseTTL)
	}
	if c.Ramdisk.GatewayURL == "" {
		c.Ramdisk.GatewayURL = c.GatewayURL
	}
	if len(c.Ramdisk.CAPEM) == 0 {
		// The CA given for the first join, or the bundle agentlink keeps from it in the data
		// dir, read again whenever it changes: a rotation of the agent CA brings the next CA
		// to the agent, and ramdisks and installed OSes booted from then on trust it too.
		c.Ramdisk.CAPEM = c.CAPEM
		if c.DataDir != "" && c.Ramdisk.CA == nil {
			src := &caSource{path: filepath.Join(c.DataDir, agentlink.CAFile), fallback: c.CAPEM}
			c.Ramdisk.CA = src.current
			c.Ramdisk.CAPEM = src.current()
		}
	}
	if c.DHCPMode != dhcp.ModeOff && !c.ServerIP.IsValid() {
		ip, err := InterfaceIPv4(c.Interface)
		if err != nil {
			return fmt.Errorf("configuring site agent: %w", err)
		}
		c.ServerIP = ip
	}
	return nil
}

// InterfaceIPv4 is the first IPv4 address of the named interface.
func InterfaceIPv4(name string) (netip.Addr, error) {
	if name == "" {
		return netip.Addr{}, errors.New("DHCP needs the provisioning interface (--interface) or the server IP (--server-ip)")
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("finding interface %s: %w", name, err)
	}
	addrs, err := ifc.Addrs()
	if err != nil {
		return netip.Addr{}, fmt.Errorf("reading the addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("interface %s has no IPv4 address", name)
}

// BaseURL decides the URL machines fetch boot scripts from: explicit when given, else the
// listener's address, with serverIP in place of an unspecified host. Pure.
func BaseURL(explicit string, ln net.Addr, serverIP netip.Addr) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	ap, err := netip.ParseAddrPort(ln.String())
	if err != nil {
		return "", fmt.Errorf("boot HTTP address %s: %w", ln, err)
	}
	host := ap.Addr().Unmap()
	if host.IsUnspecified() {
		if !serverIP.IsValid() {
			return "", errors.New("the boot HTTP server listens on every address: give --http-url (as machines reach it) or --server-ip")
		}
		host = serverIP
	}
	return "http://" + netip.AddrPortFrom(host, ap.Port()).String(), nil
}

// HTTPAddr is the boot HTTP server's address.
func (a *Agent) HTTPAddr() net.Addr { return a.httpLn.Addr() }

// BootURL is the base URL machines are sent to.
func (a *Agent) BootURL() string { return a.baseURL }

// Entries is the agent's boot-entry table.
func (a *Agent) Entries() *Entries { return a.entries }

// HoldsBootLease reports whether the agent serves DHCP and boot scripts now.
func (a *Agent) HoldsBootLease() bool { return a.hold.Held() }

// Link waits until the agent has joined and returns its gateway link.
func (a *Agent) Link(ctx context.Context) (*agentlink.Link, error) {
	select {
	case <-a.linkReady:
		a.linkMu.Lock()
		defer a.linkMu.Unlock()
		if a.link == nil {
			return nil, errors.New("the site agent did not join")
		}
		return a.link, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the gateway link: %w", ctx.Err())
	}
}

func (a *Agent) key(ctx context.Context) (crypto.Signer, error) {
	l, err := a.Link(ctx)
	if err != nil {
		return nil, err
	}
	return l.Key(), nil
}

func (a *Agent) poke() {
	select {
	case a.dirty <- struct{}{}:
	default:
	}
}

func (a *Agent) closeAll() {
	if a.cfg.ArtifactCache == nil && a.cache != nil {
		a.cache.Close()
	}
	if a.httpLn != nil && a.cfg.HTTPListener == nil {
		a.httpLn.Close()
	}
	if a.tftpC != nil && a.cfg.TFTPConn == nil {
		a.tftpC.Close()
	}
	if a.metricsLn != nil && a.cfg.MetricsListener == nil {
		a.metricsLn.Close()
	}
}

// MetricsAddr is where /metrics is served; nil when it is not.
func (a *Agent) MetricsAddr() net.Addr {
	if a.metricsLn == nil {
		return nil
	}
	return a.metricsLn.Addr()
}

// connected says whether a stream to the gateway is open and answered (false before the join).
func (a *Agent) connected() bool {
	a.linkMu.Lock()
	defer a.linkMu.Unlock()
	return a.link != nil && a.link.Connected()
}

// sessions counts the streams to the gateway opened so far (0 before the join).
func (a *Agent) sessions() int {
	a.linkMu.Lock()
	defer a.linkMu.Unlock()
	if a.link == nil {
		return 0
	}
	return a.link.Sessions()
}

// Run joins (once), dials the gateway and serves until ctx ends or the gateway refuses the
// agent. It may be called once.
func (a *Agent) Run(ctx context.Context) error {
	defer a.closeAll()
	defer a.bg.Wait() // before the cache closes
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if a.metrics != nil {
		// From the start, joined or not: a scrape tells an agent that cannot join from one
		// that is not running.
		defer a.metrics.serveMetrics(ctx, a.metricsLn, a.log)()
		defer cancel()
	}
	// From the start, joined or not: a full disk is what may keep the agent from working.
	a.bg.Go(func() { a.pruneLoop(ctx, a.log) })

	// The link outlives ctx by the moment the lease loop takes to hand the boot lease back on a
	// clean stop (another agent then takes over at once instead of after the TTL); until the
	// agent has joined, ctx ends it.
	linkCtx, stopLink := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLink()
	joined := context.AfterFunc(ctx, stopLink)
	link, err := agentlink.Dial(linkCtx, agentlink.Config{
		GatewayURL: a.cfg.GatewayURL, CAPEM: a.cfg.CAPEM, DataDir: a.cfg.DataDir, Kind: agentlink.KindSite,
		JoinToken: a.cfg.JoinToken, Logger: a.log, AgentVersion: a.cfg.AgentVersion,
		Capabilities: a.handler.Kinds(), Drivers: driverNames(a.drivers), Sessions: []string{KindBMCConsole},
		HeartbeatInterval: a.cfg.HeartbeatInterval, MinBackoff: a.cfg.MinBackoff, MaxBackoff: a.cfg.MaxBackoff,
	}, a.handler)
	if err != nil {
		close(a.linkReady)
		return fmt.Errorf("site agent: joining the control plane: %w", err)
	}
	joined()
	a.linkMu.Lock()
	a.link = link
	a.linkMu.Unlock()
	close(a.linkReady)
	id := link.Identity()
	if err := checkSiteName(a.cfg.DataDir, a.cfg.Site, id.SiteID); err != nil {
		cancel()
		stopLink()
		_ = link.Wait()
		return fmt.Errorf("site agent: %w", err)
	}
	log := a.log.With("site", id.SiteID, "agent", id.AgentID)
	log.Info("site agent connected", "gateway", a.cfg.GatewayURL, "boot_url", a.baseURL, "dhcp", string(a.cfg.DHCPMode),
		"entries", a.entries.Len())

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		err := link.Wait()
		if err != nil {
			return fmt.Errorf("site agent: gateway link: %w", err)
		}
		return nil
	})
	lease := a.cfg.Lease
	if lease == nil {
		gl := newGatewayLease(link, func(full bool, es []agentlink.BootEntry) error { return a.applyPushed(gctx, full, es) }, log)
		gl.rejected = a.setRejected
		if a.dhcpReports != nil {
			gl.reports, gl.known = a.dhcpReports, a.setKnownLeases
		}
		lease = gl
		if a.poller != nil {
			if a.poller.reporter == nil {
				lr := newLinkReporter(link, gl, log)
				a.poller.reporter = lr
				g.Go(func() error { lr.Run(gctx, reportInterval); return nil })
			}
			a.poller.SetActive(false) // until the lease and the poll set say otherwise
			g.Go(func() error { pollSetLoop(gctx, link, gl, a.poller, log); return nil })
		}
	}
	g.Go(func() error {
		leaseLoop(gctx, lease, id.SiteID, id.AgentID, a.cfg.LeaseTTL, a.hold, log) // releases it at the end
		a.drain(ctx, link, log)
		stopLink()
		return nil
	})
	g.Go(func() error { a.statusLoop(gctx, link); return nil })
	if a.poller != nil {
		g.Go(func() error { a.poller.Run(gctx); return nil })
	}
	if err := a.serveHTTP(gctx, g, log); err != nil {
		cancel()
		_ = g.Wait()
		return err
	}
	if a.tftpC != nil {
		if err := a.serveTFTP(gctx, g, log); err != nil {
			cancel()
			_ = g.Wait()
			return err
		}
	}
	if a.cfg.DHCPMode != dhcp.ModeOff {
		g.Go(func() error { a.superviseDHCP(gctx, log); return nil })
	}
	return g.Wait()
}

// drain lets the commands running finish and report, on a clean stop (ctx ended), for at most
// DrainTimeout.
func (a *Agent) drain(ctx context.Context, link *agentlink.Link, log *slog.Logger) {
	if ctx.Err() == nil || a.cfg.DrainTimeout < 0 {
		return // not a stop: the link failed
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.cfg.DrainTimeout)
	defer cancel()
	start := time.Now()
	if err := link.Drain(dctx); err != nil {
		log.Warn("stopping with commands still running: they are cancelled and reported interrupted", "error", err, "after", time.Since(start).Round(time.Millisecond))
		return
	}
	log.Info("drained: every running command finished and was reported", "after", time.Since(start).Round(time.Millisecond))
}

func (a *Agent) serveHTTP(ctx context.Context, g *errgroup.Group, log *slog.Logger) error {
	var discBoot *netboot.Entry
	if a.cfg.DiscoveryBoot {
		e, err := DiscoveryEntry(a.cfg.Ramdisk)
		if err != nil {
			return fmt.Errorf("site agent: discovery boot: %w", err)
		}
		discBoot = &e
		// No command asks for the discovery-mode ramdisk: it is cached now, and for as long
		// as it takes.
		for _, art := range e.Artifacts() {
			a.keepFetching(ctx, art, "discovery boot", func() bool { return true })
		}
	}
	hc := netboot.HandlerConfig{BaseURL: a.baseURL, RetryAfter: a.cfg.RetryAfter,
		Entries: a.entries, Discovery: a.disc, Artifacts: a.cache, Metadata: a.entries, UserData: a.entries, BinaryDir: existingDir(a.cfg.IPXEDir),
		DiscoveryBoot: discBoot, Rejections: a, Now: a.cfg.Now, Logger: log}
	if a.cfg.BootBinding == BindLease {
		hc.Bindings, hc.Withheld = a.entries, a.withheld
	} else {
		log.Warn("boot binding none: boot scripts, with their one-time tokens, go to any host that asks by MAC, and /metadata to the address a MAC's script was fetched from; keep other hosts off the provisioning network")
	}
	nb, err := netboot.NewHandler(hc)
	if err != nil {
		return fmt.Errorf("site agent: %w", err)
	}
	// Anyone on the provisioning network reaches this server: every connection, request body,
	// idle keep-alive and stalled response is bounded.
	srv := &http.Server{Handler: a.metrics.bootHTTP(withDeadlines(a.gate(nb), a.cfg.HTTPBodyTimeout, a.cfg.HTTPWriteTimeout)),
		ReadHeaderTimeout: httpHeaderTimeout, IdleTimeout: a.cfg.HTTPIdleTimeout, MaxHeaderBytes: 64 << 10,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	ln := newLimitListener(a.httpLn, a.cfg.HTTPMaxConns)
	g.Go(func() error {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("site agent: serving boot HTTP: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			// Downloads still running: cut them.
			log.Warn("boot HTTP: requests still running at the stop are cut", "err", err)
			_ = srv.Close()
		}
		return nil
	})
	return nil
}

// gate refuses discovery reports unless the agent boots machines in discovery mode, answers
// boot-script requests only while the agent holds the boot lease and, with boot binding none,
// learns which address each MAC with an entry boots from (for /metadata; with binding lease
// the DHCP service tells).
func (a *Agent) gate(next http.Handler) http.Handler {
	retry := strconv.Itoa(int(a.cfg.LeaseTTL / time.Second))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == netboot.DiscoveryPath && !a.cfg.DiscoveryBoot {
			// Only discovery-mode ramdisks report, and only an agent that boots them does
			// (--discovery-boot) listens: anything else is a stranger's.
			http.NotFound(w, r)
			return
		}
		if r.URL.Path == netboot.ScriptPath {
			if !a.hold.Held() {
				w.Header().Set("Retry-After", retry)
				http.Error(w, "this site agent does not hold the boot lease", http.StatusServiceUnavailable)
				return
			}
			if req, err := netboot.ParseQuery(r.URL.RawQuery); err == nil && a.cfg.BootBinding == BindNone && a.entries.Has(req.MAC.String()) {
				if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
					a.entries.Learn(ap.Addr().Unmap(), req.MAC.String())
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// fetchLoop is a running keepFetching loop: the reasons to fetch its artifact, each with what
// says whether it still holds.
type fetchLoop struct {
	reasons map[string]func() bool
}

// Retries of background artifact fetches: the wait doubles from fetchRetryMin up to
// fetchRetryMax.
const (
	fetchRetryMin = time.Second
	fetchRetryMax = 30 * time.Second
)

// keepFetching caches art in the background (a.bg), retrying with backoff until it is cached,
// no reason to fetch it (why, with its needed) holds any more, or ctx ends. One retry loop runs
// per digest: another reason given meanwhile joins the loop already running.
func (a *Agent) keepFetching(ctx context.Context, art netboot.Artifact, why string, needed func() bool) {
	a.fetchMu.Lock()
	if a.fetching == nil {
		a.fetching = map[string]*fetchLoop{}
	}
	loop, running := a.fetching[art.SHA256]
	if !running {
		loop = &fetchLoop{reasons: map[string]func() bool{}}
		a.fetching[art.SHA256] = loop
	}
	loop.reasons[why] = needed
	a.fetchMu.Unlock()
	if running {
		return
	}
	// end forgets this loop (not a later one for the same digest); stillNeeded does so in the
	// same hold of the lock as it finds no reason left, so that a reason given meanwhile starts
	// a new loop instead of joining one that is ending.
	end := func() {
		if a.fetching[art.SHA256] == loop {
			delete(a.fetching, art.SHA256)
		}
	}
	stillNeeded := func() bool {
		a.fetchMu.Lock()
		defer a.fetchMu.Unlock()
		for _, f := range loop.reasons {
			if f() {
				return true
			}
		}
		end()
		return false
	}
	a.bg.Go(func() {
		defer func() {
			a.fetchMu.Lock()
			end()
			a.fetchMu.Unlock()
		}()
		wait := a.fetchRetry
		if wait <= 0 {
			wait = fetchRetryMin
		}
		for ctx.Err() == nil && stillNeeded() {
			err := a.cache.Fetch(ctx, art)
			if err == nil || ctx.Err() != nil {
				return
			}
			a.log.WarnContext(ctx, "caching an artifact failed; retrying", "for", why, "artifact", art.Name, "in", wait, "err", err)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			wait = min(2*wait, fetchRetryMax)
		}
	})
}

func existingDir(d string) string {
	if fi, err := os.Stat(d); err == nil && fi.IsDir() {
		return d
	}
	return ""
}

func (a *Agent) serveTFTP(ctx context.Context, g *errgroup.Group, log *slog.Logger) error {
	route, err := tftp.NewDirRoute(a.cfg.IPXEDir)
	if err != nil {
		return fmt.Errorf("site agent: TFTP of %s (install Debian's ipxe package or give --ipxe-dir): %w", a.cfg.IPXEDir, err)
	}
	srv, err := tftp.New(tftp.Config{Routes: []tftp.Route{route}, Conn: a.tftpC, Counters: a.metrics.tftpCounters(), Logger: log})
	if err != nil {
		route.Close()
		return fmt.Errorf("site agent: %w", err)
	}
	g.Go(func() error {
		defer route.Close()
		if err := srv.Serve(ctx); err != nil && ctx.Err() == nil {
			return fmt.Errorf("site agent: serving TFTP: %w", err)
		}
		return nil
	})
	return nil
}

// superviseDHCP runs the DHCP service while the agent holds the boot lease.
func (a *Agent) superviseDHCP(ctx context.Context, log *slog.Logger) {
	whileHeld(ctx, a.hold, func(ctx context.Context) error {
		srv, err := dhcp.New(ctx, a.dhcpConfig(log))
		if err != nil {
			return err
		}
		log.Info("DHCP serving", "mode", string(a.cfg.DHCPMode), "interface", a.cfg.Interface)
		return srv.Serve(ctx)
	}, dhcpRestartDelay, log)
}

// dhcpConfig is the DHCP service's configuration as it starts: with the site's leases the
// control plane gave this agent when it took the boot lease, observed by the boot binding and
// the lease reports.
func (a *Agent) dhcpConfig(log *slog.Logger) dhcp.Config {
	var known []dhcp.Lease
	if k := a.dhcpKnown.Load(); k != nil {
		known = *k
	}
	return dhcp.Config{Mode: a.cfg.DHCPMode, Interface: a.cfg.Interface, ServerIP: a.cfg.ServerIP,
		HTTPBaseURL: a.baseURL, Boot: dhcp.Policy{EFIBinary: a.cfg.EFIBinary}, Pools: a.cfg.DHCPPools,
		Leases: dhcp.NewFileLeaseStore(filepath.Join(a.cfg.DataDir, "dhcp-leases.json")), Known: known, Observe: a.observeDHCP, Logger: log,
		Probe: a.cfg.DHCPProbe, Counters: a.metrics.dhcpCounters()}
}

// whileHeld runs run while hold says the lease is held: started on acquisition, cancelled
// (and waited for) when the hold ends or ctx does; restarted after restartDelay when it fails.
func whileHeld(ctx context.Context, hold *holdState, run func(ctx context.Context) error, restartDelay time.Duration, log *slog.Logger) {
	var (
		stop    context.CancelFunc
		done    chan struct{}
		retryAt time.Time
	)
	halt := func() {
		if stop != nil {
			stop()
			<-done
			stop, done = nil, nil
		}
	}
	defer halt()
	for {
		changed := hold.changed()
		held := hold.Held()
		if done != nil {
			select {
			case <-done:
				stop, done = nil, nil
				retryAt = hold.now().Add(restartDelay)
			default:
			}
		}
		switch {
		case held && done == nil && !hold.now().Before(retryAt):
			rctx, cancel := context.WithCancel(ctx)
			stop, done = cancel, make(chan struct{})
			d := done
			go func() {
				defer close(d)
				if err := run(rctx); err != nil && rctx.Err() == nil {
					log.Error("boot service failed while holding the boot lease", "err", err)
				}
			}()
		case !held && done != nil:
			halt()
		}
		var wake <-chan time.Time
		var t *time.Timer
		if held {
			next := hold.Until()
			if done == nil && retryAt.Before(next) {
				next = retryAt
			}
			t = time.NewTimer(max(next.Sub(hold.now()), time.Millisecond))
			wake = t.C
		}
		var finished <-chan struct{}
		if done != nil {
			finished = done
		}
		select {
		case <-ctx.Done():
		case <-changed:
		case <-wake:
		case <-finished:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// statusSessionCheck is how often the status loop looks for a new stream to the control plane
// (the inventories it carried then go out again).
const statusSessionCheck = 2 * time.Second

// statusLoop reports the lease, the discovered machines and the withheld boot scripts whenever
// they change. A report carries at most reportInventoryBytes of inventories: while more wait,
// the next report follows after statusMinInterval.
func (a *Agent) statusLoop(ctx context.Context, link *agentlink.Link) {
	drivers := driverNames(a.drivers)
	var last statusKey
	first := true
	sessions := link.Sessions()
	check := time.NewTicker(statusSessionCheck)
	defer check.Stop()
	for {
		if s := link.Sessions(); s != sessions {
			sessions = s
			a.disc.resend()
		}
		// While the last report has not gone out (no stream, or the sender is behind), no new
		// one: it would replace it, and the inventories it carried, counted as sent, would
		// never reach the control plane.
		if first || !link.StatusPending() {
			rep := a.disc.report(reportInventoryBytes)
			st := agentlink.Status{HoldsBootLease: a.hold.Held(), Discovered: rep.machines, Drivers: drivers, Facts: a.statusFacts(),
				Withheld: a.withheld.Snapshot(a.cfg.Now())}
			if k := keyOf(st, rep.rev); first || k != last {
				link.SetStatus(st)
				last, first = k, false
			}
			if !rep.more {
				if !a.waitStatusChange(ctx, link, sessions, check.C, st.HoldsBootLease) {
					return
				}
			}
		}
		pause := time.NewTimer(statusMinInterval)
		select {
		case <-ctx.Done():
			pause.Stop()
			return
		case <-pause.C:
		}
	}
}

// waitStatusChange waits until something a status report carries may have changed, or a new
// stream to the control plane began; false when ctx ended.
func (a *Agent) waitStatusChange(ctx context.Context, link *agentlink.Link, sessions int, check <-chan time.Time, held bool) bool {
	changed := a.hold.changed()
	var expiry <-chan time.Time
	if held {
		t := time.NewTimer(max(a.hold.Until().Sub(a.hold.now()), time.Millisecond))
		defer t.Stop()
		expiry = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-a.dirty:
		case <-changed:
		case <-expiry:
		case <-check:
			if link.Sessions() == sessions {
				continue
			}
		}
		return ctx.Err() == nil
	}
}

// siteNameFile records, in the data dir, which site name the agent joined under: operators
// name sites, certificates carry their ids.
const siteNameFile = "site-name.json"

// checkSiteName accepts --site as the id in the agent's certificate, or as the name the agent
// first joined under (recorded at that first start).
func checkSiteName(dataDir, site, certSiteID string) error {
	path := filepath.Join(dataDir, siteNameFile)
	var rec struct {
		Name string `json:"name"`
		ID   string `json:"id"`
	}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if site == certSiteID {
			return nil
		}
		rec.Name, rec.ID = site, certSiteID
		b, _ := json.Marshal(rec)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return fmt.Errorf("recording the site name: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading the site name: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	if site == certSiteID || (site == rec.Name && rec.ID == certSiteID) {
		return nil
	}
	return fmt.Errorf("the certificate in %s is for site %s (joined as %q), not %s", dataDir, certSiteID, rec.Name, site)
}
