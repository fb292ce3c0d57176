package site

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/iana"
	pintftp "github.com/pin/tftp/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"bcd/internal/agentlink"
	"bcd/internal/bmc"
	"bcd/internal/dhcp"
	"bcd/internal/netboot"
	"bcd/internal/tftp"
)

// series flattens what reg gathers of the site agent's own metrics: "name{l=v,…}" → value; a
// histogram gives its count as name_count (its sum varies with time).
func series(t testing.TB, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "bcd_site_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			name, v := mf.GetName(), 0.0
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				v = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				name, v = name+"_count", float64(m.GetHistogram().GetSampleCount())
			}
			out[key(name, m.GetLabel())] = v
		}
	}
	return out
}

func key(name string, labels []*dto.LabelPair) string {
	var ls []string
	for _, l := range labels {
		ls = append(ls, l.GetName()+"="+l.GetValue())
	}
	sort.Strings(ls)
	return name + "{" + strings.Join(ls, ",") + "}"
}

// moved is what changed between two snapshots.
func moved(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// testView is an agent's state as fixed numbers.
func testView(cache *netboot.Cache) agentView {
	return agentView{dhcpMode: dhcp.ModeProxy, kinds: []string{KindBMCQuery, KindCleanUp}, drivers: []string{"fake"}, cache: cache,
		entries: func() int { return 3 }, held: func() bool { return true }, sessions: func() int { return 2 }, connected: func() bool { return true },
		journal: func() string { return "" }}
}

// fakeBMC answers power reads; slow makes them wait for the context's end.
type fakeBMC struct{ slow bool }

func (f fakeBMC) GetPower(ctx context.Context) (bmc.PowerState, error) {
	if f.slow {
		<-ctx.Done()
		return "", fmt.Errorf("reading power: %w", ctx.Err())
	}
	return bmc.PowerOn, nil
}

// TestMetricsHooks drives every hook (a DHCP exchange and a TFTP read over loopback, boot HTTP
// requests, BMC calls, commands) and checks that exactly the series it should moved, by exactly
// the amount it should.
func TestMetricsHooks(t *testing.T) {
	cache, err := netboot.NewCache(netboot.CacheConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	m := newMetrics(testView(cache))
	ctx := t.Context()

	// The DHCP service, proxy mode, on loopback sockets.
	client, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	dconn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	pconn, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	cport := client.LocalAddr().(*net.UDPAddr).Port
	dsrv, err := dhcp.New(ctx, dhcp.Config{Mode: dhcp.ModeProxy, ServerIP: lo, HTTPBaseURL: "http://127.0.0.1:8080",
		Boot: dhcp.Policy{EFIBinary: dhcp.BinaryEFI}, Conn: dconn, PXEConn: pconn, ClientPort: cport, RelayPort: cport, BroadcastAddr: lo,
		Counters: m.dhcpCounters()})
	if err != nil {
		t.Fatal(err)
	}
	dctx, stopDHCP := context.WithCancel(ctx)
	dhcpDone := make(chan error, 1)
	go func() { dhcpDone <- dsrv.Serve(dctx) }()
	defer func() { stopDHCP(); <-dhcpDone }()
	pxe := []dhcpv4.Modifier{dhcpv4.WithOption(dhcpv4.OptClientArch(iana.INTEL_X86PC)),
		dhcpv4.WithOption(dhcpv4.OptClassIdentifier("PXEClient:Arch:00000:UNDI:002001"))}
	mac := net.HardwareAddr{0x52, 0x54, 0, 0, 0, 0x0a}

	// The TFTP server, on a loopback socket.
	ipxeDir := t.TempDir()
	binary := bytes.Repeat([]byte("K"), 3000)
	if err := os.WriteFile(filepath.Join(ipxeDir, "undionly.kpxe"), binary, 0o644); err != nil {
		t.Fatal(err)
	}
	route, err := tftp.NewDirRoute(ipxeDir)
	if err != nil {
		t.Fatal(err)
	}
	defer route.Close()
	tconn, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tsrv, err := tftp.New(tftp.Config{Routes: []tftp.Route{route}, Conn: tconn, Timeout: 500 * time.Millisecond, Retries: 2, Counters: m.tftpCounters()})
	if err != nil {
		t.Fatal(err)
	}
	tctx, stopTFTP := context.WithCancel(ctx)
	tftpDone := make(chan error, 1)
	go func() { tftpDone <- tsrv.Serve(tctx) }()
	defer func() { stopTFTP(); <-tftpDone }()
	tclient, err := pintftp.NewClient(tconn.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}

	// Boot HTTP as the agent serves it: counted, then bounded, then the routes (a file served
	// as artifacts are, by ServeContent, and a refused script).
	artifact := bytes.Repeat([]byte("A"), 700_000)
	artPath := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(artPath, artifact, 0o644); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+netboot.ArtifactPath+"{sha}/{name}", func(w http.ResponseWriter, r *http.Request) {
		f, err := os.Open(artPath)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		http.ServeContent(w, r, "vmlinuz", time.Time{}, f)
	})
	mux.HandleFunc("GET "+netboot.ScriptPath, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "this site agent does not hold the boot lease", http.StatusServiceUnavailable)
	})
	hsrv := httptest.NewServer(m.bootHTTP(withDeadlines(mux, time.Second, time.Second)))
	defer hsrv.Close()
	get := func(t *testing.T, path string) []byte {
		t.Helper()
		resp, err := http.Get(hsrv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	// BMC drivers and a command handler.
	reg := map[string]DriverFactory{
		"fake": func(context.Context, bmc.Endpoint) (any, error) { return fakeBMC{}, nil },
	}
	call := func(factory DriverFactory, timeout time.Duration) error {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		r := map[string]DriverFactory{"fake": factory}
		return withDriverCounted(cctx, r, "fake", bmc.Endpoint{Address: "10.0.0.5", Password: "pw"}, "get power", capGetPower, m,
			func(ctx context.Context, drv any) error {
				_, err := drv.(bmc.PowerGetter).GetPower(ctx)
				return err
			})
	}
	entries, err := OpenEntries(t.TempDir(), "https://gw:7443", nil)
	if err != nil {
		t.Fatal(err)
	}
	h := newHandler(handlerDeps{drivers: reg, locks: newBMCLocks(), entries: entries, log: slog.New(slog.DiscardHandler)})
	h.metrics = m
	run := func(kind string) {
		_, _ = h.Run(ctx, agentlink.Command{ID: "c1", Kind: kind, NodeID: "n1", Args: []byte(`{"nodeId":"n1"}`)}, nil)
	}

	tests := []struct {
		name  string
		drive func(t *testing.T)
		want  map[string]float64
	}{
		{"DHCP proxy offer", func(t *testing.T) {
			d, err := dhcpv4.NewDiscovery(mac, pxe...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := client.WriteToUDP(d.ToBytes(), dconn.LocalAddr().(*net.UDPAddr)); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 1500)
			_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, _, err := client.ReadFromUDP(buf); err != nil {
				t.Fatalf("no offer: %v", err)
			}
		}, map[string]float64{
			"bcd_site_dhcp_requests_total{mode=proxy,type=discover}": 1,
			"bcd_site_dhcp_replies_total{type=proxy_offer}":          1,
		}},
		{"DHCP not a network-boot client", func(t *testing.T) {
			d, err := dhcpv4.NewDiscovery(mac)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := client.WriteToUDP(d.ToBytes(), dconn.LocalAddr().(*net.UDPAddr)); err != nil {
				t.Fatal(err)
			}
		}, map[string]float64{
			"bcd_site_dhcp_requests_total{mode=proxy,type=discover}": 1,
			"bcd_site_dhcp_unanswered_total{reason=not_netboot}":     1,
		}},
		{"TFTP read", func(t *testing.T) {
			wt, err := tclient.Receive("undionly.kpxe", "octet")
			if err != nil {
				t.Fatal(err)
			}
			if n, err := wt.WriteTo(io.Discard); err != nil || n != int64(len(binary)) {
				t.Fatalf("read %d bytes, %v", n, err)
			}
		}, map[string]float64{
			"bcd_site_tftp_files_served_total{}": 1,
			"bcd_site_tftp_sent_bytes_total{}":   float64(len(binary)),
		}},
		{"TFTP not found", func(t *testing.T) {
			if wt, err := tclient.Receive("snponly.efi", "octet"); err == nil {
				_, _ = wt.WriteTo(io.Discard)
			}
		}, map[string]float64{"bcd_site_tftp_failures_total{reason=not_found}": 1}},
		{"HTTP artifact", func(t *testing.T) {
			if b := get(t, netboot.ArtifactPath+"abc/vmlinuz"); len(b) != len(artifact) {
				t.Fatalf("got %d bytes", len(b))
			}
		}, map[string]float64{
			"bcd_site_http_requests_total{code=2xx,route=artifact}": 1,
			"bcd_site_http_sent_bytes_total{route=artifact}":        float64(len(artifact)),
		}},
		{"HTTP script refused", func(t *testing.T) {
			get(t, netboot.ScriptPath+"?mac=52:54:00:00:00:0a")
		}, map[string]float64{
			"bcd_site_http_requests_total{code=5xx,route=script}": 1,
			"bcd_site_http_sent_bytes_total{route=script}":        float64(len("this site agent does not hold the boot lease\n")),
		}},
		{"HTTP unknown path", func(t *testing.T) { get(t, "/etc/passwd") }, map[string]float64{
			"bcd_site_http_requests_total{code=4xx,route=other}": 1,
			"bcd_site_http_sent_bytes_total{route=other}":        float64(len("404 page not found\n")),
		}},
		{"BMC call", func(t *testing.T) {
			if err := call(reg["fake"], time.Minute); err != nil {
				t.Fatal(err)
			}
		}, map[string]float64{
			"bcd_site_bmc_calls_total{driver=fake,op=get_power,result=ok}": 1,
			"bcd_site_bmc_call_duration_seconds_count{driver=fake}":        1,
		}},
		{"BMC does not answer", func(t *testing.T) {
			_ = call(func(context.Context, bmc.Endpoint) (any, error) { return nil, errors.New("dial tcp: refused") }, time.Minute)
		}, map[string]float64{
			"bcd_site_bmc_calls_total{driver=fake,op=get_power,result=error}": 1,
			"bcd_site_bmc_errors_total{driver=fake,reason=connect}":           1,
			"bcd_site_bmc_call_duration_seconds_count{driver=fake}":           1,
		}},
		{"BMC driver cannot", func(t *testing.T) {
			_ = call(func(context.Context, bmc.Endpoint) (any, error) { return struct{}{}, nil }, time.Minute)
		}, map[string]float64{
			"bcd_site_bmc_calls_total{driver=fake,op=get_power,result=error}": 1,
			"bcd_site_bmc_errors_total{driver=fake,reason=unsupported}":       1,
			"bcd_site_bmc_call_duration_seconds_count{driver=fake}":           1,
		}},
		{"BMC times out", func(t *testing.T) {
			_ = call(func(context.Context, bmc.Endpoint) (any, error) { return fakeBMC{slow: true}, nil }, 10*time.Millisecond)
		}, map[string]float64{
			"bcd_site_bmc_calls_total{driver=fake,op=get_power,result=error}": 1,
			"bcd_site_bmc_errors_total{driver=fake,reason=timeout}":           1,
			"bcd_site_bmc_call_duration_seconds_count{driver=fake}":           1,
		}},
		{"command", func(t *testing.T) { run(KindCleanUp) }, map[string]float64{
			"bcd_site_commands_total{kind=boot.cleanUp,result=ok}": 1,
		}},
		{"command failed", func(t *testing.T) { run(KindBMCQuery) }, map[string]float64{
			"bcd_site_commands_total{kind=bmc.query,result=error}": 1,
		}},
		{"command of an unknown kind", func(t *testing.T) { run("disk.wipe") }, map[string]float64{
			"bcd_site_commands_total{kind=unknown,result=error}": 1,
		}},
		{"power poll", func(t *testing.T) { m.powerPoll(errors.New("timeout")) }, map[string]float64{
			"bcd_site_power_polls_total{result=error}": 1,
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := series(t, m.reg)
			tc.drive(t)
			// DHCP packets and TFTP transfers are counted on the servers' goroutines, once the
			// client has its answer (or none is due): poll with a deadline.
			var got map[string]float64
			for deadline := time.Now().Add(10 * time.Second); ; {
				got = moved(before, series(t, m.reg))
				if len(got) >= len(tc.want) || time.Now().After(deadline) {
					break
				}
				time.Sleep(time.Millisecond)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s moved by %v, want %v", k, got[k], v)
				}
			}
			for k, v := range got {
				if _, ok := tc.want[k]; !ok {
					t.Errorf("%s moved by %v, want 0", k, v)
				}
			}
		})
	}
	// The gauges and the counters read at scrape time.
	for k, want := range map[string]float64{"bcd_site_boot_entries{}": 3, "bcd_site_boot_lease_held{}": 1,
		"bcd_site_gateway_sessions_total{}": 2, "bcd_site_gateway_up{}": 1, "bcd_site_commands_in_flight{}": 0, "bcd_site_cache_artifacts{}": 0} {
		if got := series(t, m.reg)[k]; got != want {
			t.Errorf("%s = %v, want %v", k, got, want)
		}
	}
}

// allowedLabels: every label of the agent's metrics, and the values it may take. None comes from
// a node, a MAC, an address or a URL: the series stay as many as these sets allow.
func allowedLabels(drivers, kinds []string) map[string][]string {
	var dhcpTypes, reasons, ops []string
	for t := range dhcp.NumRequestTypes {
		dhcpTypes = append(dhcpTypes, t.String())
	}
	for t := range dhcp.NumReplyTypes {
		dhcpTypes = append(dhcpTypes, t.String())
	}
	for u := range dhcp.NumUnanswered {
		reasons = append(reasons, u.String())
	}
	for f := range tftp.NumFailures {
		reasons = append(reasons, f.String())
	}
	reasons = append(reasons, bmcFailures()...)
	for _, c := range bmcCapabilities() {
		ops = append(ops, opLabel(c))
	}
	return map[string][]string{
		"mode":   {string(dhcp.ModeOff), string(dhcp.ModeProxy), string(dhcp.ModeFull), string(dhcp.ModeObserve)},
		"type":   dhcpTypes,
		"reason": reasons,
		"route":  {routeScript, routeArtifact, routeBinary, routeMetadata, routeDiscovery, routeDecision, routeOther},
		"code":   {"1xx", "2xx", "3xx", "4xx", "5xx", "other"},
		"driver": drivers,
		"op":     ops,
		"result": {resultOK, resultError},
		"kind":   append(slices.Clone(kinds), kindUnknown),
		"le":     nil, // histogram buckets: checked as numbers
	}
}

// No metric has a label outside the allow-list, nor a value outside its label's fixed set, after
// traffic that names nodes, MACs and addresses went through every hook.
func TestMetricLabelsBounded(t *testing.T) {
	cache, err := netboot.NewCache(netboot.CacheConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Close()
	v := testView(cache)
	m := newMetrics(v)
	ctx := t.Context()
	// Traffic naming nodes, MACs, addresses and paths.
	h := m.bootHTTP(http.NotFoundHandler())
	for _, p := range []string{"/boot.ipxe?mac=52:54:00:00:00:01", "/artifacts/0123/vmlinuz", "/metadata", "/10.0.0.7", "/discovery/decision"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, p, nil))
	}
	reg := map[string]DriverFactory{"fake": func(context.Context, bmc.Endpoint) (any, error) { return fakeBMC{}, nil }}
	for _, c := range bmcCapabilities() {
		_ = withDriverCounted(ctx, reg, "fake", bmc.Endpoint{Address: "10.0.0.5"}, "x", c, m, func(context.Context, any) error { return nil })
	}
	entries, err := OpenEntries(t.TempDir(), "https://gw:7443", nil)
	if err != nil {
		t.Fatal(err)
	}
	hd := newHandler(handlerDeps{drivers: reg, locks: newBMCLocks(), entries: entries, log: slog.New(slog.DiscardHandler)})
	hd.metrics = m
	for _, kind := range []string{KindCleanUp, "node-n1-kind"} {
		_, _ = hd.Run(ctx, agentlink.Command{ID: "c", Kind: kind, NodeID: "n1", Args: []byte(`{"nodeId":"n1"}`)}, nil)
	}
	m.dhcp.Requests[dhcp.RequestDiscover].Add(1)
	m.tftp.Failed[tftp.FailNotFound].Add(1)

	allowed := allowedLabels(v.drivers, v.kinds)
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "bcd_site_") {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				values, ok := allowed[l.GetName()]
				switch {
				case !ok:
					t.Errorf("%s has label %s (value %q): not in the allow-list", mf.GetName(), l.GetName(), l.GetValue())
				case values != nil && !slices.Contains(values, l.GetValue()):
					t.Errorf("%s{%s=%q}: not one of %v", mf.GetName(), l.GetName(), l.GetValue(), values)
				}
				checked++
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d labels: the metrics were not gathered", checked)
	}
}

// --metrics-listen off (or none) listens nowhere; an address that cannot be listened on stops the
// agent at its start, naming it; an address given is listened on.
func TestMetricsListen(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	tests := []struct {
		listen  string
		serves  bool
		wantErr string
	}{
		{listen: "off"},
		{listen: ""},
		{listen: "127.0.0.1:0", serves: true},
		{listen: busy.Addr().String(), wantErr: "listening for metrics on " + busy.Addr().String()},
	}
	for _, tc := range tests {
		t.Run(tc.listen, func(t *testing.T) {
			httpLn, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer httpLn.Close()
			a, err := New(Config{GatewayURL: "https://127.0.0.1:1", Site: "s1", DataDir: t.TempDir(), HTTPListener: httpLn,
				MetricsListen: tc.listen})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New: %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer a.closeAll()
			addr := a.MetricsAddr()
			if (addr != nil) != tc.serves || (a.metrics != nil) != tc.serves {
				t.Fatalf("metrics address %v, counting %v; want serving %v", addr, a.metrics != nil, tc.serves)
			}
			if !tc.serves {
				return
			}
			if ap, err := netip.ParseAddrPort(addr.String()); err != nil || !ap.Addr().IsLoopback() {
				t.Errorf("metrics on %s, want loopback", addr)
			}
		})
	}
}

// The metrics server answers /metrics and /healthz until its context ends, and then releases its
// address.
func TestServeMetrics(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := newMetrics(testView(nil))
	ctx, cancel := context.WithCancel(t.Context())
	wait := m.serveMetrics(ctx, ln, slog.New(slog.DiscardHandler))
	base := "http://" + ln.Addr().String()
	for path, want := range map[string]string{"/healthz": "ok\n", "/metrics": "bcd_site_boot_lease_held 1\n"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("GET %s: %d, body lacks %q", path, resp.StatusCode, want)
		}
	}
	cancel()
	wait()
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Error("the metrics address still accepts connections after the stop")
	}
}

// BenchmarkBMCCall is the BMC hook's cost: a call to a driver that answers at once, with the
// metrics off (nil) and on.
func BenchmarkBMCCall(b *testing.B) {
	reg := map[string]DriverFactory{"fake": func(context.Context, bmc.Endpoint) (any, error) { return fakeBMC{}, nil }}
	ep := bmc.Endpoint{Address: "10.0.0.5", Password: "pw"}
	for _, tc := range []struct {
		name string
		m    *metrics
	}{{"metrics=off", nil}, {"metrics=on", newMetrics(testView(nil))}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx := b.Context()
			b.ReportAllocs()
			for b.Loop() {
				if err := withDriverCounted(ctx, reg, "fake", ep, "get power", capGetPower, tc.m, func(ctx context.Context, drv any) error {
					_, err := drv.(bmc.PowerGetter).GetPower(ctx)
					return err
				}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
