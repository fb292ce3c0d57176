//go:build linux

package dhcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/server4"
)

// The DHCP performance benchmark: bcd's full-mode server and dnsmasq, one after the other, on
// the same veth pair between two network namespaces the benchmark creates, loaded by the same
// generator, Kea's perfdhcp (Debian kea-admin), in relay mode (giaddr = the client end) from
// many simulated clients. It reports figures only; it fails when a server cannot be started or
// perfdhcp's output cannot be read, never on timing.
//
//	go test -run '^$' -bench DHCPPerf -benchtime 1x ./internal/dhcp/
//
// BCD_DHCP_PERF_RATES (e.g. "500,1000,2000") and BCD_DHCP_PERF_SECONDS tune the ladder,
// BCD_DHCP_PERF_SERVERS (bcd,dnsmasq) and BCD_DHCP_PERF_MODES (DO,DORA) what it runs.

const (
	perfServerAddr = "10.77.0.1"
	perfClientAddr = "10.77.0.2"
	perfClients    = 10000
)

// perfRun is one perfdhcp run at one offered rate.
type perfRun struct {
	Rate     float64       // offered exchanges per second
	Achieved float64       // completed exchanges per second (perfdhcp's "Rate:")
	DODrops  float64       // DISCOVER-OFFER drops ratio, %
	RADrops  float64       // REQUEST-ACK drops ratio, % (DORA runs)
	DOp50    time.Duration // DISCOVER→OFFER
	DOp99    time.Duration
	RAp50    time.Duration // REQUEST→ACK
	RAp99    time.Duration
	DOn, RAn int // exchanges timed
}

// parsePerfdhcp reads perfdhcp's report (run with -x t: every successful exchange's send and
// receive timestamps).
func parsePerfdhcp(out []byte) (perfRun, error) {
	var r perfRun
	var do, ra []time.Duration
	section := ""
	sawRate := false
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "Rate: "):
			f := strings.Fields(line)
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return r, fmt.Errorf("perfdhcp rate %q: %w", line, err)
			}
			r.Achieved, sawRate = v, true
		case strings.HasPrefix(line, "***Statistics for: "), strings.HasPrefix(line, "***Timestamps for packets: "):
			section = line
		case strings.HasPrefix(line, "drops ratio: "):
			v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(line, "drops ratio: "), "%")), 64)
			if err != nil {
				return r, fmt.Errorf("perfdhcp drops %q: %w", line, err)
			}
			if strings.Contains(section, "DISCOVER-OFFER") {
				r.DODrops = v
			} else if strings.Contains(section, "REQUEST-ACK") {
				r.RADrops = v
			}
		case strings.HasPrefix(line, "sent / received: "):
			f := strings.Fields(strings.TrimPrefix(line, "sent / received: "))
			if len(f) != 3 {
				return r, fmt.Errorf("perfdhcp timestamp line %q", line)
			}
			s, err1 := strconv.ParseFloat(f[0], 64)
			e, err2 := strconv.ParseFloat(f[2], 64)
			if err1 != nil || err2 != nil {
				return r, fmt.Errorf("perfdhcp timestamp line %q", line)
			}
			d := time.Duration((e - s) * float64(time.Second))
			if strings.Contains(section, "DISCOVER-OFFER") {
				do = append(do, d)
			} else if strings.Contains(section, "REQUEST-ACK") {
				ra = append(ra, d)
			}
		}
	}
	if !sawRate {
		return r, errors.New("perfdhcp printed no rate")
	}
	r.DOn, r.RAn = len(do), len(ra)
	r.DOp50, r.DOp99 = quantile(do, 0.50), quantile(do, 0.99)
	r.RAp50, r.RAp99 = quantile(ra, 0.50), quantile(ra, 0.99)
	return r, nil
}

// quantile is the nearest-rank q-quantile of ds (0 for none).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

func TestParsePerfdhcp(t *testing.T) {
	out := `Running: perfdhcp -4 -l pc0 -r 1000 -R 5000 -p 10 -x t 10.77.0.1
***Rate statistics***
Rate: 112.278 4-way exchanges/second, expected rate: 1000
***Statistics for: DISCOVER-OFFER***
sent packets: 9998
drops ratio: 82.6565 %
***Statistics for: REQUEST-ACK***
drops ratio: 35.236 %
***Timestamps for packets: DISCOVER-OFFER***
sent / received: 000000.000074 / 000000.001074
sent / received: 000000.002154 / 000000.005154
***Timestamps for packets: REQUEST-ACK***
sent / received: 000001.000000 / 000001.000500
`
	r, err := parsePerfdhcp([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	want := perfRun{Achieved: 112.278, DODrops: 82.6565, RADrops: 35.236, DOp50: time.Millisecond, DOp99: 3 * time.Millisecond,
		RAp50: 500 * time.Microsecond, RAp99: 500 * time.Microsecond, DOn: 2, RAn: 1}
	round := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	r.DOp50, r.DOp99, r.RAp50, r.RAp99 = round(r.DOp50), round(r.DOp99), round(r.RAp50), round(r.RAp99)
	if r != want {
		t.Fatalf("parsed %+v, want %+v", r, want)
	}
	if _, err := parsePerfdhcp([]byte("perfdhcp: error")); err == nil {
		t.Fatal("output without a rate parsed")
	}
}

func TestQuantile(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(i))
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50}, {0.99, 99}, {1, 100}, {0.001, 1}} {
		if got := quantile(ds, c.q); got != c.want {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if quantile(nil, 0.5) != 0 {
		t.Error("quantile of nothing is not 0")
	}
}

// perfEnv is the benchmark's two namespaces joined by a veth pair.
type perfEnv struct {
	srvNS, cliNS string
	dir          string
}

func newPerfEnv(b *testing.B) *perfEnv {
	b.Helper()
	e := &perfEnv{srvNS: fmt.Sprintf("bcdps%d", os.Getpid()), cliNS: fmt.Sprintf("bcdpc%d", os.Getpid()), dir: b.TempDir()}
	cmds := [][]string{
		{"ip", "netns", "add", e.srvNS},
		{"ip", "netns", "add", e.cliNS},
		{"ip", "link", "add", "ps0", "netns", e.srvNS, "type", "veth", "peer", "name", "pc0", "netns", e.cliNS},
		{"ip", "-n", e.srvNS, "addr", "add", perfServerAddr + "/16", "dev", "ps0"},
		{"ip", "-n", e.cliNS, "addr", "add", perfClientAddr + "/16", "dev", "pc0"},
		{"ip", "-n", e.srvNS, "link", "set", "ps0", "up"},
		{"ip", "-n", e.cliNS, "link", "set", "pc0", "up"},
		{"ip", "-n", e.srvNS, "link", "set", "lo", "up"},
		{"ip", "-n", e.cliNS, "link", "set", "lo", "up"},
	}
	b.Cleanup(func() {
		exec.Command("ip", "netns", "del", e.srvNS).Run()
		exec.Command("ip", "netns", "del", e.cliNS).Run()
	})
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", strings.Join(c, " "), err, out)
		}
	}
	return e
}

var perfPool = Pool{Subnet: netip.MustParsePrefix("10.77.0.0/16"), Start: netip.MustParseAddr("10.77.1.0"),
	End: netip.MustParseAddr("10.77.255.254"), Routers: []netip.Addr{netip.MustParseAddr(perfServerAddr)}, LeaseTime: time.Hour}

// startBCD runs the full-mode server in the server namespace (its socket made there); the
// returned function stops it and waits.
func (e *perfEnv) startBCD(b *testing.B, run int) func() {
	b.Helper()
	cfg := Config{Mode: ModeFull, Interface: "ps0", ServerIP: netip.MustParseAddr(perfServerAddr),
		HTTPBaseURL: "http://" + perfServerAddr, Boot: Policy{EFIBinary: BinaryEFI}, Pools: []Pool{perfPool},
		Leases: NewFileLeaseStore(filepath.Join(e.dir, fmt.Sprintf("bcd-%d.json", run)))}
	if err := inNetns(e.srvNS, func() error {
		c, err := server4.NewIPv4UDPConn("ps0", &net.UDPAddr{Port: 67})
		cfg.Conn = c
		return err
	}); err != nil {
		b.Fatal(err)
	}
	srv, err := New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("bcd DHCP: %v", err)
		}
	}
}

// startDnsmasq runs dnsmasq in the server namespace with the same range and lease time, DHCP
// only, with the lease database in a file like ours. --no-ping: dnsmasq's default ICMP check of
// a new address holds each fresh OFFER for up to 3 s (about one new client per 3 s); --quiet-dhcp:
// no log line per packet (ours logs them at debug level, off here).
func (e *perfEnv) startDnsmasq(b *testing.B, run int) func() {
	b.Helper()
	logPath := filepath.Join(e.dir, fmt.Sprintf("dnsmasq-%d.log", run))
	cmd := exec.Command("ip", "netns", "exec", e.srvNS, "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null",
		"--log-facility="+logPath, "--port=0", "--user=root", "--pid-file=",
		"--interface=ps0", "--bind-interfaces", "--dhcp-authoritative",
		"--dhcp-range="+perfPool.Start.String()+","+perfPool.End.String()+",255.255.0.0,1h",
		"--dhcp-option=option:router,"+perfServerAddr,
		"--dhcp-leasefile="+filepath.Join(e.dir, fmt.Sprintf("dnsmasq-%d.leases", run)),
		"--dhcp-lease-max=100000", "--no-ping", "--quiet-dhcp")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		b.Fatalf("starting dnsmasq: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	// Ready once its DHCP socket exists (in its namespace's view of /proc/PID/net/udp).
	deadline := time.Now().Add(10 * time.Second)
	for {
		if ok, _ := udpBound(fmt.Sprintf("/proc/%d/net/udp", cmd.Process.Pid), 67); ok {
			return stop
		}
		select {
		case err := <-done:
			b.Fatalf("dnsmasq exited: %v\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			b.Fatalf("dnsmasq not listening after 10 s\n%s", stderr.String())
		}
	}
}

func udpBound(path string, port int) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	want := fmt.Sprintf(":%04X", port)
	for _, l := range strings.Split(string(b), "\n")[1:] {
		if f := strings.Fields(l); len(f) > 1 && strings.HasSuffix(f[1], want) {
			return true, nil
		}
	}
	return false, nil
}

// perfdhcp runs the load generator from the client namespace: rate exchanges per second for
// secs seconds from perfClients clients; doOnly limits exchanges to DISCOVER→OFFER (-i).
func (e *perfEnv) perfdhcp(b *testing.B, rate, secs int, doOnly bool) perfRun {
	b.Helper()
	args := []string{"netns", "exec", e.cliNS, "perfdhcp", "-4", "-l", "pc0", "-r", strconv.Itoa(rate),
		"-R", strconv.Itoa(perfClients), "-p", strconv.Itoa(secs), "-x", "t"}
	if doOnly {
		args = append(args, "-i")
	}
	args = append(args, perfServerAddr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+30)*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	r, perr := parsePerfdhcp(out)
	if perr != nil {
		b.Fatalf("perfdhcp %v: %v (%v)\n%s", args, perr, err, tailLines(out, 20))
	}
	r.Rate = float64(rate)
	return r
}

func tailLines(b []byte, n int) string {
	l := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

func perfLadder() ([]int, int) {
	rates := []int{250, 500, 1000, 2000, 4000}
	if s := os.Getenv("BCD_DHCP_PERF_RATES"); s != "" {
		rates = nil
		for _, f := range strings.Split(s, ",") {
			if v, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && v > 0 {
				rates = append(rates, v)
			}
		}
	}
	secs := 5
	if v, err := strconv.Atoi(os.Getenv("BCD_DHCP_PERF_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	return rates, secs
}

// sustained is the best achieved rate among runs that dropped at most 1 % of their exchanges,
// and that run's p99s.
func sustained(runs []perfRun) perfRun {
	var best perfRun
	for _, r := range runs {
		if r.DODrops <= 1 && r.RADrops <= 1 && r.Achieved > best.Achieved {
			best = r
		}
	}
	return best
}

// BenchmarkDHCPPerf: for each server, each offered rate of the ladder, a DISCOVER→OFFER-only run
// and a full DORA run, each against a freshly started server (empty lease file).
func BenchmarkDHCPPerf(b *testing.B) {
	if testing.Short() {
		b.Skip("DHCP performance benchmark: not under -short")
	}
	if os.Geteuid() != 0 {
		b.Skip("DHCP performance benchmark: needs root (network namespaces)")
	}
	for _, p := range []string{"ip", "dnsmasq", "perfdhcp"} {
		if _, err := exec.LookPath(p); err != nil {
			b.Skipf("DHCP performance benchmark: needs %s (Debian iproute2, dnsmasq-base, kea-admin)", p)
		}
	}
	servers := []string{"bcd", "dnsmasq"}
	if s := os.Getenv("BCD_DHCP_PERF_SERVERS"); s != "" {
		servers = strings.Split(s, ",")
	}
	modes := []string{"DO", "DORA"}
	if s := os.Getenv("BCD_DHCP_PERF_MODES"); s != "" {
		modes = strings.Split(s, ",")
	}
	rates, secs := perfLadder()
	e := newPerfEnv(b)
	b.ResetTimer()
	run := 0
	var table strings.Builder
	fmt.Fprintf(&table, "%-8s %-5s %7s %9s %7s %7s %9s %9s %9s %9s\n", "server", "mode", "offered", "achieved", "DO drop", "RA drop", "DO p50", "DO p99", "RA p50", "RA p99")
	for _, srv := range servers {
		for _, mode := range modes {
			var runs []perfRun
			for _, rate := range rates {
				run++
				var stop func()
				switch srv {
				case "bcd":
					stop = e.startBCD(b, run)
				case "dnsmasq":
					stop = e.startDnsmasq(b, run)
				default:
					b.Fatalf("server %q: accepted are bcd, dnsmasq", srv)
				}
				r := e.perfdhcp(b, rate, secs, mode == "DO")
				stop()
				runs = append(runs, r)
				fmt.Fprintf(&table, "%-8s %-5s %7.0f %9.1f %6.2f%% %6.2f%% %9s %9s %9s %9s\n", srv, mode, r.Rate, r.Achieved, r.DODrops, r.RADrops,
					r.DOp50.Round(time.Microsecond), r.DOp99.Round(time.Microsecond), r.RAp50.Round(time.Microsecond), r.RAp99.Round(time.Microsecond))
			}
			best := sustained(runs)
			fmt.Fprintf(&table, "%-8s %-5s sustained (≤1%% drops): %.1f/s, DO p99 %s, RA p99 %s\n", srv, mode, best.Achieved,
				best.DOp99.Round(time.Microsecond), best.RAp99.Round(time.Microsecond))
			b.ReportMetric(best.Achieved, srv+"-"+mode+"/s")
			b.ReportMetric(float64(best.DOp99.Microseconds()), srv+"-"+mode+"-DOp99-µs")
		}
	}
	b.Logf("perfdhcp, %d clients, %d s per run, relay mode over a veth pair:\n%s", perfClients, secs, table.String())
}
