//go:build linux

package dhcp

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"golang.org/x/sys/unix"
)

// need fails the test under CI (CI=true) and skips it otherwise.
func need(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s (CI=true: failing instead of skipping)", what)
	}
	t.Skipf("needs %s", what)
}

func run(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// inNetns runs f on an OS thread switched into the named network namespace; sockets f creates
// stay in that namespace.
func inNetns(name string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		ns, err := os.Open(filepath.Join("/run/netns", name))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering netns %s: %w", name, err)
			return
		}
		ferr := f()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: it dies with the goroutine instead of serving others.
			errc <- fmt.Errorf("leaving netns %s: %w", name, err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// fullModeInNetns starts the full-mode server inside a network namespace the test creates (a
// veth pair with private addresses, nothing attached to the host's networks) and returns the
// namespace's name and the server; the client end is cli0. Needs root and iproute2.
func fullModeInNetns(t *testing.T) (string, *Server) {
	t.Helper()
	need(t, os.Geteuid() == 0, "root (network namespaces)")
	_, ipErr := exec.LookPath("ip")
	need(t, ipErr == nil, "the ip command (Debian iproute2)")

	ns := fmt.Sprintf("bcd-dhcp-%d", os.Getpid())
	run(t, "ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run(t, "ip", "-n", ns, "link", "add", "srv0", "type", "veth", "peer", "name", "cli0")
	run(t, "ip", "-n", ns, "addr", "add", "192.168.77.1/24", "dev", "srv0")
	for _, l := range []string{"lo", "srv0", "cli0"} {
		run(t, "ip", "-n", ns, "link", "set", l, "up")
	}

	var conn interface{ Close() error }
	cfg := Config{
		Mode: ModeFull, Interface: "srv0", ServerIP: netip.MustParseAddr("192.168.77.1"),
		HTTPBaseURL: "http://192.168.77.1:8080", Boot: Policy{EFIBinary: BinaryEFI},
		Pools: []Pool{{
			Subnet: netip.MustParsePrefix("192.168.77.0/24"), Start: netip.MustParseAddr("192.168.77.100"), End: netip.MustParseAddr("192.168.77.120"),
			Routers: []netip.Addr{netip.MustParseAddr("192.168.77.1")}, DNS: []netip.Addr{netip.MustParseAddr("192.168.77.1")}, Domain: "lab.test",
		}},
		Leases: NewFileLeaseStore(filepath.Join(t.TempDir(), "leases.json")),
	}
	if err := inNetns(ns, func() error {
		c, err := server4.NewIPv4UDPConn("srv0", nil)
		cfg.Conn, conn = c, c
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	srv, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ns, srv
}

func checkOneLease(t *testing.T, srv *Server) {
	t.Helper()
	leases := srv.Leases()
	if len(leases) != 1 || leases[0].IP != netip.MustParseAddr("192.168.77.100") {
		t.Fatalf("server leases: %+v", leases)
	}
}

// TestFullModeUdhcpcInNetns: busybox udhcpc gets a lease with router, DNS, domain and lease time.
func TestFullModeUdhcpcInNetns(t *testing.T) {
	busybox, bbErr := exec.LookPath("busybox")
	need(t, bbErr == nil, "busybox (Debian busybox-static)")
	ns, srv := fullModeInNetns(t)

	script := filepath.Join(t.TempDir(), "udhcpc.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho \"event=$1 ip=$ip mask=$mask router=$router dns=$dns domain=$domain lease=$lease\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	start := time.Now()
	out, err := exec.CommandContext(cctx, "ip", "netns", "exec", ns, busybox, "udhcpc",
		"-i", "cli0", "-f", "-q", "-n", "-t", "5", "-T", "1", "-s", script).CombinedOutput()
	if err != nil {
		t.Fatalf("udhcpc: %v\n%s", err, out)
	}
	t.Logf("udhcpc got a lease in %s:\n%s", time.Since(start), out)
	for _, want := range []string{"event=bound", "ip=192.168.77.100", "mask=24", "router=192.168.77.1", "domain=lab.test", "lease=3600"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("udhcpc output lacks %q:\n%s", want, out)
		}
	}
	checkOneLease(t, srv)
}

// TestFullModeDhclientInNetns: ISC dhclient (Debian isc-dhcp-client) gets the same lease. Its
// script only records what it was given (the stock dhclient-script would rewrite the host's
// /etc/resolv.conf).
func TestFullModeDhclientInNetns(t *testing.T) {
	dhclient, err := exec.LookPath("dhclient")
	need(t, err == nil, "dhclient (Debian isc-dhcp-client)")
	ns, srv := fullModeInNetns(t)

	dir := t.TempDir()
	record, pidFile := filepath.Join(dir, "record"), filepath.Join(dir, "dhclient.pid")
	script := filepath.Join(dir, "dhclient.sh")
	body := "#!/bin/sh\necho \"reason=$reason ip=$new_ip_address mask=$new_subnet_mask router=$new_routers dns=$new_domain_name_servers domain=$new_domain_name lease=$new_dhcp_lease_time\" >> " + record + "\n"
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "dhclient.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cctx, ccancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer ccancel()
	// -1: try once; -d: stay in the foreground once bound, as this test's child, so that it is
	// killed and reaped before the test's directory is removed (a daemon stopped by its pid
	// could still be writing its files there as the removal ran).
	cmd := exec.CommandContext(cctx, "ip", "netns", "exec", ns, dhclient, "-d", "-1", "-v", "-sf", script,
		"-lf", filepath.Join(dir, "leases"), "-pf", pidFile, "cli0")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting dhclient: %v", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	// Registered after t.TempDir's removal, so run before it (cleanups run last first).
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	var out []byte
	deadline := time.After(45 * time.Second)
	for {
		out, _ = os.ReadFile(record)
		// The script's one line for the lease, whole.
		if i := strings.Index(string(out), "reason=BOUND"); i >= 0 && strings.Contains(string(out[i:]), "\n") {
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("dhclient exited without a lease: %v\n%s", waitErr, log)
		case <-deadline:
			log, _ := os.ReadFile(logf.Name())
			t.Fatalf("dhclient got no lease in 45 s:\n%s", log)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Logf("dhclient:\n%s", out)
	for _, want := range []string{"reason=BOUND", "ip=192.168.77.100", "mask=255.255.255.0", "router=192.168.77.1", "domain=lab.test", "lease=3600"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("dhclient's script got no %q:\n%s", want, out)
		}
	}
	checkOneLease(t, srv)
}

// TestICMPProberInNetns: the prober, with its socket in the server's namespace, finds an
// address a host on the link holds (it answers the echo) and not a free one (no answer within
// the timeout), with probes in flight at once. Two namespaces the test creates, joined by a
// veth pair with private addresses. Needs root and iproute2.
func TestICMPProberInNetns(t *testing.T) {
	need(t, os.Geteuid() == 0, "root (network namespaces)")
	_, ipErr := exec.LookPath("ip")
	need(t, ipErr == nil, "the ip command (Debian iproute2)")
	srv, host := fmt.Sprintf("bcd-probe-s-%d", os.Getpid()), fmt.Sprintf("bcd-probe-h-%d", os.Getpid())
	for _, ns := range []string{srv, host} {
		run(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	run(t, "ip", "-n", srv, "link", "add", "srv0", "type", "veth", "peer", "name", "cli0", "netns", host)
	run(t, "ip", "-n", srv, "addr", "add", "192.168.78.1/24", "dev", "srv0")
	run(t, "ip", "-n", host, "addr", "add", "192.168.78.100/24", "dev", "cli0")
	for _, l := range [][2]string{{srv, "lo"}, {srv, "srv0"}, {host, "lo"}, {host, "cli0"}} {
		run(t, "ip", "-n", l[0], "link", "set", l[1], "up")
	}
	var p *ICMPProber
	if err := inNetns(srv, func() error {
		var err error
		p, err = NewICMPProber(300 * time.Millisecond)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	used, free := netip.MustParseAddr("192.168.78.100"), netip.MustParseAddr("192.168.78.101")
	// The first echo may wait for ARP: allow it a few tries.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := p.InUse(ctx, used)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s, held by the other namespace, never answered", used)
		}
	}
	type res struct {
		ip  netip.Addr
		ok  bool
		err error
	}
	out := make(chan res, 8)
	for i := range 8 {
		ip := used
		if i%2 == 1 {
			ip = free
		}
		go func() {
			ok, err := p.InUse(ctx, ip)
			out <- res{ip, ok, err}
		}()
	}
	for range 8 {
		r := <-out
		if r.err != nil || r.ok != (r.ip == used) {
			t.Errorf("probe of %s: in use %v (%v), want %v", r.ip, r.ok, r.err, r.ip == used)
		}
	}
}
