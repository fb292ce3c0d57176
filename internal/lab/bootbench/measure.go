package bootbench

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"

	"bcd/internal/dhcp"
	"bcd/internal/lab"
	"bcd/internal/lab/vbmc"
	"bcd/internal/netboot"
	"bcd/internal/pki"
	"bcd/internal/site"
)

// Timeouts of a measurement.
const (
	// BootDeadline is how long one boot may take before the benchmark fails (LAB-NOTES: allow
	// ≥ 240 s per VM under TCG).
	BootDeadline   = 240 * time.Second
	consolePoll    = 20 * time.Millisecond
	serviceUp      = 10 * time.Second
	childStopWait  = 10 * time.Second
	kernelName     = "vmlinuz"
	initrdName     = "initramfs.cpio.gz"
	fileSharePort  = 8081
	benchGateway   = 7443 // the ramdisk's bcd.gateway port: nothing listens, it retries after "ready"
	samplesFile    = "bootbench-samples.json"
	ipxeBinaryDir  = "/usr/lib/ipxe"
	dnsmasqProgram = "dnsmasq"
	busyboxProgram = "busybox"
)

// MeasureConfig is what the inner half measures.
type MeasureConfig struct {
	LabDir     string // a running lab (state.json), whose namespace this process runs in
	RamdiskDir string // vmlinuz + initramfs.cpio.gz (make ramdisk)
	Runs       int
	Firmwares  []lab.Firmware
	Servers    []Server
	Log        *slog.Logger
}

// env is what every boot of a measurement shares.
type env struct {
	st      lab.State
	work    string
	base    string // http://<bridge>: both servers' boot HTTP
	entries *site.Entries
	cache   *netboot.Cache
	script  string // the baseline's static boot.ipxe
	log     *slog.Logger
}

// Measure boots the lab's VMs Runs times per firmware and server, one boot at a time (the runs
// alternate the server order so drift in the machine's load spreads over both), and returns a
// sample per boot. It runs inside the lab's namespace.
func Measure(ctx context.Context, cfg MeasureConfig) ([]Sample, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Runs < 1 {
		return nil, fmt.Errorf("measuring boots: %d runs: at least 1", cfg.Runs)
	}
	st, err := lab.ReadState(cfg.LabDir)
	if err != nil {
		return nil, fmt.Errorf("measuring boots: %w", err)
	}
	vms := map[lab.Firmware]lab.VMState{}
	for _, vm := range st.VMs {
		if _, ok := vms[vm.Firmware]; !ok {
			vms[vm.Firmware] = vm
		}
	}
	for _, fw := range cfg.Firmwares {
		if _, ok := vms[fw]; !ok {
			return nil, fmt.Errorf("measuring boots: the lab has no %s VM", fw)
		}
	}
	for _, srv := range cfg.Servers {
		if srv == ServerDnsmasq {
			for _, p := range []string{dnsmasqProgram, busyboxProgram} {
				if _, err := exec.LookPath(p); err != nil {
					return nil, fmt.Errorf("measuring boots: the dnsmasq baseline needs %s (Debian dnsmasq-base, busybox-static)", p)
				}
			}
		}
	}
	e, err := prepare(ctx, st, cfg.RamdiskDir, log)
	if err != nil {
		return nil, fmt.Errorf("measuring boots: %w", err)
	}
	defer e.cache.Close()

	var samples []Sample
	for run := range cfg.Runs {
		order := cfg.Servers
		if run%2 == 1 {
			order = reversed(order)
		}
		for _, fw := range cfg.Firmwares {
			for _, srv := range order {
				s, err := e.boot(ctx, srv, vms[fw], run)
				if err != nil {
					return samples, fmt.Errorf("measuring boots: run %d, %s, %s: %w", run+1, fw, srv, err)
				}
				log.InfoContext(ctx, "boot measured", "run", run+1, "firmware", fw, "server", srv,
					"ready", s.Ready.Round(time.Millisecond).String(), "line", s.Line)
				samples = append(samples, s)
			}
		}
	}
	return samples, nil
}

func reversed(s []Server) []Server {
	out := make([]Server, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}

// prepare builds what every boot shares: the ramdisk entry of each VM (as the site agent holds
// it after boot.prepareRamdisk), the site's artifact cache filled with the kernel and initramfs
// (the agent fetches them when the entry arrives, before the machine boots), and the baseline's
// web root (the same files and a static script with the same command line).
func prepare(ctx context.Context, st lab.State, ramdiskDir string, log *slog.Logger) (_ *env, err error) {
	work := filepath.Join(st.Dir, "bootbench")
	if err := os.RemoveAll(work); err != nil {
		return nil, err
	}
	www := filepath.Join(work, "www")
	if err := os.MkdirAll(www, 0o755); err != nil {
		return nil, err
	}
	br := st.BridgeIPv4.Addr()
	e := &env{st: st, work: work, base: "http://" + br.String(), log: log}

	// The file share the site fetches from, only while filling its cache.
	ln, err := net.Listen("tcp", netip.AddrPortFrom(br, fileSharePort).String())
	if err != nil {
		return nil, fmt.Errorf("file share: %w", err)
	}
	fs := &http.Server{Handler: http.FileServer(http.Dir(ramdiskDir)), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = fs.Serve(ln) }()
	defer fs.Close()
	share := "http://" + ln.Addr().String() + "/"
	var arts [2]netboot.Artifact
	for i, name := range []string{kernelName, initrdName} {
		sum, err := lab.FileSHA256(filepath.Join(ramdiskDir, name))
		if err != nil {
			return nil, fmt.Errorf("ramdisk (make ramdisk): %w", err)
		}
		arts[i] = netboot.Artifact{Name: name, URL: share + name, SHA256: sum}
		if err := copyFile(filepath.Join(ramdiskDir, name), filepath.Join(www, name)); err != nil {
			return nil, err
		}
	}
	if e.cache, err = netboot.NewCache(netboot.CacheConfig{Dir: filepath.Join(work, "cache"), Logger: log}); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			e.cache.Close()
		}
	}()
	for _, a := range arts {
		if err := e.cache.Fetch(ctx, a); err != nil {
			return nil, err
		}
	}

	ca, err := throwawayCA()
	if err != nil {
		return nil, err
	}
	token := make([]byte, 24)
	_, _ = rand.Read(token)
	gw := st.GatewayURL(benchGateway)
	entry, err := site.RamdiskEntry(site.RamdiskConfig{Kernel: arts[0], Initrd: arts[1], GatewayURL: gw,
		ExtraArgs: []string{"console=ttyS0"}, CAPEM: ca}, hex.EncodeToString(token))
	if err != nil {
		return nil, err
	}
	if e.entries, err = site.OpenEntries("", gw, ca); err != nil {
		return nil, err
	}
	for _, vm := range st.VMs {
		if err := e.entries.Install("bootbench-"+vm.Name, []string{vm.MAC}, entry); err != nil {
			return nil, err
		}
	}

	// The baseline's script carries the very command line bcd's script gives the kernel.
	mac, _ := net.ParseMAC(st.VMs[0].MAC)
	bcdScript, err := netboot.Script(&entry, netboot.Request{MAC: mac, UUID: st.VMs[0].UUID, Arch: "x86_64"},
		netboot.ScriptParams{BaseURL: e.base, RetryAfter: site.DefaultRetryAfter})
	if err != nil {
		return nil, err
	}
	cmdline, err := KernelLine(bcdScript)
	if err != nil {
		return nil, err
	}
	e.script = StaticScript(e.base, kernelName, initrdName, cmdline)
	if err := os.WriteFile(filepath.Join(www, "boot.ipxe"), []byte(e.script), 0o644); err != nil {
		return nil, err
	}
	return e, nil
}

// boot measures one boot of vm with srv's services: start them, power on, watch the console
// for the ready line, power off, stop them.
func (e *env) boot(ctx context.Context, srv Server, vm lab.VMState, run int) (Sample, error) {
	sctx, stopServices := context.WithCancel(ctx)
	var stop func() error
	var err error
	switch srv {
	case ServerBCD:
		stop, err = e.startBCD(sctx, run)
	case ServerDnsmasq:
		stop, err = e.startDnsmasq(sctx, run)
	default:
		err = fmt.Errorf("server %q: accepted are bcd, dnsmasq", srv)
	}
	if err != nil {
		stopServices()
		return Sample{}, err
	}
	defer func() {
		stopServices()
		if serr := stop(); serr != nil {
			e.log.Warn("stopping boot services", "server", srv, "err", serr)
		}
	}()

	m, err := vbmc.NewQEMUMachine(vbmc.QEMUConfig{QMPSocket: vm.QMPMonitor, NICDevice: lab.NICDeviceID,
		DiskDevice: lab.DiskDeviceID, CDDevice: lab.CDDeviceID}, e.log)
	if err != nil {
		return Sample{}, err
	}
	defer m.Close()
	off, err := Offset(vm.Console)
	if err != nil {
		return Sample{}, err
	}
	start := time.Now()
	if err := m.PowerOn(ctx); err != nil {
		return Sample{}, err
	}
	defer func() {
		if perr := m.PowerOff(context.WithoutCancel(ctx)); perr != nil {
			e.log.Warn("powering off", "vm", vm.Name, "err", perr)
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, BootDeadline)
	defer cancel()
	seen, err := Watch(wctx, vm.Console, off, start, Markers, consolePoll)
	if err != nil {
		return Sample{}, fmt.Errorf("%s never came online: %w; console ends with:\n%s", vm.Name, err, lab.Tail(vm.Console, 15))
	}
	return Sample{Server: srv, Firmware: vm.Firmware, Run: run + 1, VM: vm.Name, Ready: seen.At[PhaseReady],
		Phases: seen.At, Line: seen.Line}, nil
}

// startBCD runs what `bcd site run --dhcp full` serves for a machine with a ramdisk entry:
// internal/dhcp in full mode on the bridge (a fresh lease file) and the netboot handler over
// the site's entry table and artifact cache, at the bridge's port 80.
func (e *env) startBCD(ctx context.Context, run int) (func() error, error) {
	br := e.st.BridgeIPv4.Addr()
	h, err := netboot.NewHandler(netboot.HandlerConfig{BaseURL: e.base, RetryAfter: site.DefaultRetryAfter,
		Entries: e.entries, Discovery: noDiscovery{}, Artifacts: e.cache, Metadata: e.entries,
		BinaryDir: ipxeBinaryDir, Logger: e.log})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", netip.AddrPortFrom(br, 80).String())
	if err != nil {
		return nil, fmt.Errorf("boot HTTP: %w", err)
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	httpDone := make(chan struct{})
	go func() { defer close(httpDone); _ = hs.Serve(ln) }()

	leases := filepath.Join(e.work, fmt.Sprintf("bcd-leases-%d.json", run))
	_ = os.Remove(leases)
	uc, err := server4.NewIPv4UDPConn(e.st.Bridge, &net.UDPAddr{Port: dhcpv4.ServerPort})
	if err != nil {
		hs.Close()
		return nil, fmt.Errorf("DHCP socket: %w", err)
	}
	ds, err := dhcp.New(ctx, dhcp.Config{Mode: dhcp.ModeFull, Interface: e.st.Bridge, ServerIP: br, HTTPBaseURL: e.base,
		Boot: dhcp.Policy{EFIBinary: dhcp.BinaryEFI},
		Pools: []dhcp.Pool{{Subnet: e.st.BridgeIPv4.Masked(), Start: e.st.DHCPStart, End: e.st.DHCPEnd,
			Routers: []netip.Addr{br}}},
		Leases: dhcp.NewFileLeaseStore(leases), Logger: e.log, Conn: uc})
	if err != nil {
		uc.Close()
		hs.Close()
		return nil, err
	}
	dhcpDone := make(chan error, 1)
	go func() { dhcpDone <- ds.Serve(ctx) }()
	return func() error {
		err := hs.Close()
		<-httpDone
		// Serve closes its socket once ctx (cancelled by the caller) ends.
		return errors.Join(err, <-dhcpDone)
	}, nil
}

type noDiscovery struct{}

func (noDiscovery) RecordDiscovery(context.Context, netboot.Discovery) error { return nil }

// startDnsmasq runs the baseline: dnsmasq (DhcpArgs, a fresh lease file) and busybox httpd on
// the web root at the bridge's port 80, as children; it returns once both listen.
func (e *env) startDnsmasq(ctx context.Context, run int) (func() error, error) {
	br := e.st.BridgeIPv4.Addr()
	leases := filepath.Join(e.work, fmt.Sprintf("dnsmasq-%d.leases", run))
	_ = os.Remove(leases)
	args := DnsmasqArgs(Baseline{Interface: e.st.Bridge, Subnet: e.st.BridgeIPv4, Start: e.st.DHCPStart, End: e.st.DHCPEnd,
		LeaseFile: leases, ScriptURL: e.base + "/boot.ipxe"})
	dns, err := startChild(dnsmasqProgram, args, filepath.Join(e.work, "dnsmasq.log"))
	if err != nil {
		return nil, err
	}
	httpd, err := startChild(busyboxProgram, []string{"httpd", "-f", "-p", netip.AddrPortFrom(br, 80).String(),
		"-h", filepath.Join(e.work, "www")}, filepath.Join(e.work, "httpd.log"))
	if err != nil {
		return nil, errors.Join(err, dns.stop())
	}
	stop := func() error { return errors.Join(httpd.stop(), dns.stop()) }
	if err := waitListening(ctx, dns, httpd, netip.AddrPortFrom(br, 80)); err != nil {
		return nil, errors.Join(err, stop())
	}
	return stop, nil
}

// child is a process this benchmark started and owns (killed with it: Pdeathsig).
type child struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  string
}

func startChild(prog string, args []string, logPath string) (*child, error) {
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(prog, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", prog, err)
	}
	c := &child{cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { c.err = cmd.Wait(); close(c.done) }()
	return c, nil
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop ends the child (SIGTERM, then SIGKILL) and waits for it.
func (c *child) stop() error {
	if c.exited() {
		return fmt.Errorf("%s exited early (%v); its log %s ends with:\n%s", c.cmd.Path, c.err, c.log, lab.Tail(c.log, 10))
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(childStopWait):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	return nil
}

// waitListening polls until dnsmasq has its DHCP socket (port 67 in /proc/net/udp) and httpd
// accepts connections; either one exiting first is an error.
func waitListening(ctx context.Context, dns, httpd *child, httpAddr netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(ctx, serviceUp)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if dns.exited() || httpd.exited() {
			return errors.New("a baseline service exited while starting")
		}
		udp, _ := udpPortBound(dhcpv4.ServerPort)
		c, err := net.DialTimeout("tcp", httpAddr.String(), time.Second)
		if err == nil {
			c.Close()
			if udp {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("baseline services not listening after %s", serviceUp)
		case <-tick.C:
		}
	}
}

// udpPortBound reports whether a UDP socket of this namespace is bound to port.
func udpPortBound(port int) (bool, error) {
	f, err := os.Open("/proc/net/udp")
	if err != nil {
		return false, err
	}
	defer f.Close()
	want := fmt.Sprintf(":%04X ", port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 1 && strings.HasSuffix(fields[1]+" ", want) {
			return true, nil
		}
	}
	return false, sc.Err()
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return out.Close()
}

// throwawayCA is a CA certificate (PEM) for the ramdisk's bcd.ca: the ramdisk needs one on its
// command line to start; nothing here ever verifies against it.
func throwawayCA() ([]byte, error) {
	ca, err := pki.CreateCA("bcd bootbench CA", time.Now())
	if err != nil {
		return nil, err
	}
	return ca.CertPEM(), nil
}
