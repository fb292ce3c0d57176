package lab

import (
	"context"
	"crypto/sha256"
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
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Services a lab can run besides its VMs and BMCs, so that a control plane on the host drives
// the lab's machines for real (the end-to-end test, `make demo`).

// Uplink forwards TCP connections made inside the lab to Listen (an address on the bridge) to
// Target on the host's loopback. Site agents and ramdisks in the namespace reach a control plane
// running on the host that way, with no route between the namespace and the host: traffic stays
// on the bridge and on loopback.
type Uplink struct {
	Listen string `json:"listen"` // bridge address:port, inside the namespace
	Target string `json:"target"` // loopback address:port, in the host's namespace
}

// FileShare serves Dir read-only over HTTP at Listen (an address on the bridge): the ramdisk's
// kernel and initramfs, OS images.
type FileShare struct {
	Listen string `json:"listen"`
	Dir    string `json:"dir"`
}

// URL is the share's base URL as machines on the bridge reach it.
func (f FileShare) URL() string { return "http://" + f.Listen + "/" }

// SiteAgent is the `bcd site run` the supervisor runs inside the namespace as its child,
// restarted if it exits. The join token is read from JoinTokenFile (0600) into the child's
// environment: never on a command line.
type SiteAgent struct {
	Argv          []string `json:"argv"`
	JoinTokenFile string   `json:"joinTokenFile"`
	Log           string   `json:"log"`
}

// SiteOptions describe the site agent a lab runs: which site it serves and how it reaches the
// control plane's gateway on the host (through an uplink at the same port on the bridge).
type SiteOptions struct {
	Site          string // site name in the control plane
	Binary        string // the bcd binary (absolute)
	GatewayPort   int    // the control plane's gateway listens on 127.0.0.1:GatewayPort on the host
	CAFile        string // the control plane's CA (PEM)
	JoinTokenFile string // one-time bootstrap token (0600)
	// Ramdisk kernel and initramfs, as file names inside the file share's directory.
	Kernel, Initrd string
	// RamdiskArgs are extra kernel arguments of ramdisk entries (console=ttyS0 and no_timer_check
	// are always there: see osimage.BaseCmdline for why a TCG VM needs the latter).
	RamdiskArgs []string
	// DiscoveryBoot: machines with no entry boot the ramdisk in discovery mode (acceptance flow).
	DiscoveryBoot bool
}

// Well-known ports of the lab's services on the bridge.
const (
	FileSharePort = 8081
	SiteHTTPPort  = 80 // the site agent's boot HTTP (/boot.ipxe, /metadata)
)

// GatewayURL is how machines and the site agent in the lab reach the control plane's gateway.
func (s Spec) GatewayURL(port int) string {
	return "https://" + netip.AddrPortFrom(s.BridgeIPv4.Addr(), uint16(port)).String()
}

// PlanSite completes spec with the services that run a site agent for o: the file share of
// shareDir, the gateway uplink, and the site agent's command line. Pure but for hashing the
// ramdisk files (the site agent serves them only once their sha256 matched).
func PlanSite(s Spec, shareDir string, o SiteOptions) (Spec, error) {
	if o.Site == "" || o.Binary == "" || o.CAFile == "" || o.JoinTokenFile == "" || o.Kernel == "" || o.Initrd == "" {
		return Spec{}, errors.New("planning lab site agent: site, binary, CA file, join token file, kernel and initrd are required")
	}
	if o.GatewayPort < 1 || o.GatewayPort > 65535 {
		return Spec{}, fmt.Errorf("planning lab site agent: gateway port %d: accepted are 1 to 65535", o.GatewayPort)
	}
	br := s.BridgeIPv4.Addr()
	s.Files = &FileShare{Listen: netip.AddrPortFrom(br, FileSharePort).String(), Dir: shareDir}
	s.Uplinks = append(s.Uplinks, Uplink{Listen: netip.AddrPortFrom(br, uint16(o.GatewayPort)).String(),
		Target: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(o.GatewayPort)).String()})
	kernelSHA, err := FileSHA256(filepath.Join(shareDir, o.Kernel))
	if err != nil {
		return Spec{}, fmt.Errorf("planning lab site agent: ramdisk kernel: %w", err)
	}
	initrdSHA, err := FileSHA256(filepath.Join(shareDir, o.Initrd))
	if err != nil {
		return Spec{}, fmt.Errorf("planning lab site agent: ramdisk initramfs: %w", err)
	}
	gw := s.GatewayURL(o.GatewayPort)
	argv := []string{o.Binary, "site", "run",
		"--server", gw, "--site", o.Site, "--data-dir", filepath.Join(s.Dir, "site"), "--ca-file", o.CAFile,
		"--dhcp", "full", "--interface", s.Bridge, "--server-ip", br.String(),
		"--dhcp-pool", s.BridgeIPv4.Masked().String() + "," + s.DHCPStart.String() + "-" + s.DHCPEnd.String(),
		"--http-listen", netip.AddrPortFrom(br, SiteHTTPPort).String(),
		"--tftp-listen", netip.AddrPortFrom(br, 69).String(),
		"--ramdisk-kernel", s.Files.URL() + o.Kernel, "--ramdisk-kernel-sha256", kernelSHA,
		"--ramdisk-initrd", s.Files.URL() + o.Initrd, "--ramdisk-initrd-sha256", initrdSHA,
		"--ramdisk-gateway", gw, "--ramdisk-arg", "console=ttyS0", "--ramdisk-arg", "no_timer_check",
	}
	for _, a := range o.RamdiskArgs {
		argv = append(argv, "--ramdisk-arg", a)
	}
	if o.DiscoveryBoot {
		argv = append(argv, "--discovery-boot")
	}
	s.Site = &SiteAgent{Argv: argv, JoinTokenFile: o.JoinTokenFile, Log: filepath.Join(s.Dir, "site.log")}
	return s, nil
}

// FileSHA256 is the hex SHA-256 of the file at path.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// checkUplink accepts only uplinks from the bridge's address to the host's loopback: the lab
// never opens a path to anything else.
func checkUplink(s Spec, u Uplink) error {
	l, err := netip.ParseAddrPort(u.Listen)
	if err != nil || l.Addr() != s.BridgeIPv4.Addr() {
		return fmt.Errorf("uplink listen %q: must be the bridge address %s with a port", u.Listen, s.BridgeIPv4.Addr())
	}
	t, err := netip.ParseAddrPort(u.Target)
	if err != nil || !t.Addr().IsLoopback() {
		return fmt.Errorf("uplink target %q: must be a loopback address with a port", u.Target)
	}
	return nil
}

// HostDialer dials TCP in the host's network namespace from a process that runs in another one:
// each dial happens on an OS thread moved into the host's namespace (setns) and moved back to
// Home before it is released. Threads must not die instead: a child started with Pdeathsig
// (the VMs, the site agent) is killed when the thread that started it exits.
type HostDialer struct {
	NS   *os.File // the host's network namespace
	Home *os.File // this process's own network namespace
}

// DialContext dials addr in the host's namespace.
func (d HostDialer) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(int(d.NS.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread() // still in its own namespace
			ch <- result{err: fmt.Errorf("entering the host's network namespace: %w", err)}
			return
		}
		var nd net.Dialer
		c, err := nd.DialContext(ctx, "tcp", addr)
		if serr := unix.Setns(int(d.Home.Fd()), unix.CLONE_NEWNET); serr == nil {
			runtime.UnlockOSThread()
		} // else: the thread stays locked and ends with this goroutine, in the wrong namespace
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// forward accepts connections on ln and splices each to a connection dial makes, until ctx
// ends. A failed dial closes the accepted connection (the client sees a reset and retries).
func forward(ctx context.Context, ln net.Listener, dial func(context.Context) (net.Conn, error), log *slog.Logger) {
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() {
		<-ctx.Done()
		_ = ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() == nil {
				log.Error("uplink stopped accepting", "listen", ln.Addr().String(), "err", err)
			}
			return
		}
		wg.Go(func() {
			defer c.Close()
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			up, err := dial(dctx)
			cancel()
			if err != nil {
				log.Warn("uplink dial failed", "listen", ln.Addr().String(), "err", err)
				return
			}
			defer up.Close()
			stop := context.AfterFunc(ctx, func() { _ = c.Close(); _ = up.Close() })
			defer stop()
			done := make(chan struct{}, 2)
			splice := func(dst, src net.Conn) {
				_, _ = io.Copy(dst, src)
				if tc, ok := dst.(interface{ CloseWrite() error }); ok {
					_ = tc.CloseWrite()
				}
				done <- struct{}{}
			}
			go splice(up, c)
			go splice(c, up)
			<-done
			<-done
		})
	}
}

// serveUplinks starts every uplink of s. hostNS is the host's network namespace.
func serveUplinks(ctx context.Context, wg *sync.WaitGroup, s Spec, hostNS *os.File, log *slog.Logger) error {
	if len(s.Uplinks) == 0 {
		return nil
	}
	if hostNS == nil {
		return errors.New("uplinks need the host's network namespace (--host-netns-fd)")
	}
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("opening the lab's network namespace: %w", err)
	}
	wg.Go(func() {
		<-ctx.Done()
		_ = home.Close()
	})
	d := HostDialer{NS: hostNS, Home: home}
	for _, u := range s.Uplinks {
		if err := checkUplink(s, u); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", u.Listen)
		if err != nil {
			return fmt.Errorf("uplink %s: %w", u.Listen, err)
		}
		target := u.Target
		wg.Go(func() {
			forward(ctx, ln, func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, target) }, log)
		})
		log.Info("uplink", "listen", u.Listen, "target", target)
	}
	return nil
}

// serveFiles serves the file share until ctx ends.
func serveFiles(ctx context.Context, wg *sync.WaitGroup, f *FileShare, log *slog.Logger) error {
	if f == nil {
		return nil
	}
	ln, err := net.Listen("tcp", f.Listen)
	if err != nil {
		return fmt.Errorf("file share %s: %w", f.Listen, err)
	}
	srv := &http.Server{Handler: readOnlyFiles(f.Dir), ReadHeaderTimeout: 10 * time.Second}
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("file share stopped", "err", err)
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		_ = srv.Close()
	})
	log.Info("file share", "url", f.URL(), "dir", f.Dir)
	return nil
}

// readOnlyFiles serves the regular files of dir (GET and HEAD; no directory listings).
func readOnlyFiles(dir string) http.Handler {
	fs := http.FileServer(http.Dir(dir))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "read-only: GET and HEAD only", http.StatusMethodNotAllowed)
			return
		}
		fi, err := os.Stat(filepath.Join(dir, filepath.FromSlash(filepath.Clean("/"+r.URL.Path))))
		if err != nil || !fi.Mode().IsRegular() {
			http.NotFound(w, r)
			return
		}
		fs.ServeHTTP(w, r)
	})
}

// runSiteAgent runs the site agent as a child until ctx ends, restarting it (after a pause that
// grows to 30 s) when it exits.
func runSiteAgent(ctx context.Context, a *SiteAgent, log *slog.Logger) {
	backoff := time.Second
	for {
		started := time.Now()
		err := runChild(ctx, a, log)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > time.Minute {
			backoff = time.Second
		}
		log.Error("site agent exited: restarting", "err", err, "in", backoff, "log", a.Log)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

func runChild(ctx context.Context, a *SiteAgent, log *slog.Logger) error {
	tok, err := os.ReadFile(a.JoinTokenFile)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("reading site join token: %w", err)
	}
	logf, err := os.OpenFile(a.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("opening site agent log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(a.Argv[0], a.Argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "BCD_SITE_JOIN_TOKEN="+string(trimSpace(tok)))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting site agent: %w", err)
	}
	log.Info("site agent started", "pid", cmd.Process.Pid, "log", a.Log)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return fmt.Errorf("site agent (pid %s): %w", strconv.Itoa(cmd.Process.Pid), err)
	case <-ctx.Done():
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(qemuStopTimeout):
		_ = cmd.Process.Kill()
		<-done
	}
	log.Info("site agent stopped", "pid", cmd.Process.Pid)
	return nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}
