package site

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"bcd/internal/agentlink"
	"bcd/internal/dhcp"
	"bcd/internal/netboot"
	"bcd/internal/tftp"
)

// DefaultMetricsListen is where `bcd site run` serves /metrics and /healthz unless told
// otherwise: loopback, beside the server's 7480 and 7443 and the boot HTTP's 8080.
const DefaultMetricsListen = "127.0.0.1:9481"

// metricsShutdownTimeout bounds a scrape still running when the agent stops.
const metricsShutdownTimeout = 5 * time.Second

// bmcBuckets are the BMC calls' latency buckets: from a quick Redfish GET (tens of ms) to a
// slow BMC's power cycle or virtual-media insert (a minute).
func bmcBuckets() []float64 { return []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60} }

// Label values of the metrics: each from a small fixed set (kinds, drivers, reasons), never
// from a node, a MAC, an address or a URL.
const (
	resultOK    = "ok"
	resultError = "error"
)

// metrics is the site agent's Prometheus registry and what its hooks count. A nil *metrics
// counts nothing (--metrics-listen off): every method is safe to call on it.
type metrics struct {
	reg  *prometheus.Registry
	dhcp *dhcp.Counters
	tftp *tftp.Counters

	bmcCalls    *prometheus.CounterVec   // driver, op, result
	bmcErrors   *prometheus.CounterVec   // driver, reason
	bmcDuration *prometheus.HistogramVec // driver
	powerPolls  *prometheus.CounterVec   // result
	commands    *prometheus.CounterVec   // kind, result
	inFlight    prometheus.Gauge
	httpReqs    *prometheus.CounterVec // route, code
	httpBytes   *prometheus.CounterVec // route
}

// agentView is what the metrics read from the agent at scrape time.
type agentView struct {
	dhcpMode  dhcp.Mode
	kinds     []string // command kinds the agent runs
	drivers   []string // BMC drivers of its registry
	cache     *netboot.Cache
	entries   func() int
	held      func() bool
	sessions  func() int    // gateway streams opened so far (0 before the join)
	connected func() bool   // a stream to the gateway is open and answered
	journal   func() string // the command journal's path ("": none)
}

func newMetrics(v agentView) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), dhcp: &dhcp.Counters{}, tftp: &tftp.Counters{},
		bmcCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bcd_site_bmc_calls_total",
			Help: "Calls to BMCs (commands and power polls), by driver, operation and result. A rising error share for one driver points at that vendor's BMCs or their network."},
			[]string{"driver", "op", "result"}),
		bmcErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bcd_site_bmc_errors_total",
			Help: "Failed BMC calls by driver and reason: connect (the BMC did not answer or refused the login), unsupported, timeout, cancelled, call (the BMC answered with an error)."},
			[]string{"driver", "reason"}),
		bmcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "bcd_site_bmc_call_duration_seconds",
			Help: "How long BMC calls took (connecting included), by driver, successful or not.", Buckets: bmcBuckets()},
			[]string{"driver"}),
		powerPolls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bcd_site_power_polls_total",
			Help: "Power reads of the power polling, by result. A rising error rate means BMCs stopped answering (the control plane raises BMC_UNREACHABLE)."},
			[]string{"result"}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bcd_site_commands_total",
			Help: "Site commands run, by kind and result."}, []string{"kind", "result"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "bcd_site_commands_in_flight",
			Help: "Site commands running now."}),
		httpReqs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bcd_site_http_requests_total",
			Help: "Boot HTTP requests by route (script, artifact, binary, metadata, discovery, decision, other) and status class. A rising 5xx rate of scripts means machines asked an agent that does not hold the boot lease, or artifacts are not cached yet."},
			[]string{"route", "code"}),
		httpBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "bcd_site_http_sent_bytes_total",
			Help: "Bytes of boot HTTP responses by route; those of route artifact are the kernels, ramdisks and images streamed to machines."},
			[]string{"route"}),
	}
	for _, kind := range append(v.kinds, kindUnknown) {
		for _, r := range []string{resultOK, resultError} {
			m.commands.WithLabelValues(kind, r)
		}
	}
	for _, d := range v.drivers {
		m.bmcDuration.WithLabelValues(d)
		for _, c := range bmcCapabilities() {
			for _, r := range []string{resultOK, resultError} {
				m.bmcCalls.WithLabelValues(d, opLabel(c), r)
			}
		}
		for _, f := range bmcFailures() {
			m.bmcErrors.WithLabelValues(d, f)
		}
	}
	for _, r := range []string{resultOK, resultError} {
		m.powerPolls.WithLabelValues(r)
	}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.bmcCalls, m.bmcErrors, m.bmcDuration, m.powerPolls, m.commands, m.inFlight, m.httpReqs, m.httpBytes,
		&dhcpCollector{c: m.dhcp, mode: string(v.dhcpMode)}, &tftpCollector{c: m.tftp},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bcd_site_boot_lease_held",
			Help: "1 while this agent holds its site's boot lease (it answers DHCP and boot scripts), 0 otherwise."},
			func() float64 { return boolFloat(v.held()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bcd_site_boot_entries",
			Help: "Boot entries the agent holds (nodes it boots)."},
			func() float64 { return float64(v.entries()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bcd_site_gateway_up",
			Help: "1 while a stream to the control plane's gateway is open and the gateway has answered on it, 0 otherwise (before the join, between reconnects)."},
			func() float64 { return boolFloat(v.connected()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_site_gateway_sessions_total",
			Help: "Streams to the control plane's gateway opened since the agent started: every one after the first is a reconnect, so a rising rate means the link keeps dropping."},
			func() float64 { return float64(v.sessions()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bcd_site_journal_bytes",
			Help: "Size of the command journal in the data dir (compacted hourly)."},
			func() float64 { return fileSize(v.journal()) }),
	)
	if c := v.cache; c != nil {
		m.reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bcd_site_cache_bytes",
				Help: "Bytes of the artifacts the artifact cache holds (downloads in progress not counted)."},
				func() float64 { return float64(c.Stats().Bytes) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bcd_site_cache_artifacts",
				Help: "Artifacts the artifact cache holds."},
				func() float64 { return float64(c.Stats().Artifacts) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bcd_site_cache_bound_bytes",
				Help: "The artifact cache's bound (--cache-max); 0: none. bcd_site_cache_bytes above it means the artifacts in use alone exceed it."},
				func() float64 { return float64(c.Stats().Bound) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_site_cache_evictions_total",
				Help: "Artifacts evicted from the cache since the agent started. A steady rate under the bound means the cache is too small for what the site boots (artifacts downloaded again)."},
				func() float64 { return float64(c.Stats().Evictions) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_site_cache_evicted_bytes_total",
				Help: "Bytes of the artifacts evicted from the cache since the agent started."},
				func() float64 { return float64(c.Stats().EvictedBytes) }),
		)
	}
	return m
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// fileSize is the size of the file at path; 0 when there is none.
func fileSize(path string) float64 {
	if path == "" {
		return 0
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return float64(fi.Size())
}

// journalPath is the command journal of an agent whose data dir is dir.
func journalPath(dir string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, agentlink.JournalFile)
}

// dhcpCounters is what the DHCP service counts into; nil without metrics.
func (m *metrics) dhcpCounters() *dhcp.Counters {
	if m == nil {
		return nil
	}
	return m.dhcp
}

// tftpCounters is what the TFTP server counts into; nil without metrics.
func (m *metrics) tftpCounters() *tftp.Counters {
	if m == nil {
		return nil
	}
	return m.tftp
}

// kindUnknown labels a command of a kind the agent does not run.
const kindUnknown = "unknown"

// commandStarted counts a command running; the function returned counts it done.
func (m *metrics) commandStarted(kind string, known bool) func(err error) {
	if m == nil {
		return func(error) {}
	}
	if !known {
		kind = kindUnknown
	}
	m.inFlight.Inc()
	return func(err error) {
		m.inFlight.Dec()
		m.commands.WithLabelValues(kind, result(err)).Inc()
	}
}

// bmcCall counts one call to a BMC through driver: its operation (a capability), how long it
// took and, when it failed, why (bmcFailure).
func (m *metrics) bmcCall(driver, capability string, took time.Duration, failure string) {
	if m == nil {
		return
	}
	r := resultOK
	if failure != "" {
		r = resultError
		m.bmcErrors.WithLabelValues(driver, failure).Inc()
	}
	m.bmcCalls.WithLabelValues(driver, opLabel(capability), r).Inc()
	m.bmcDuration.WithLabelValues(driver).Observe(took.Seconds())
}

// powerPoll counts one read of the power polling.
func (m *metrics) powerPoll(err error) {
	if m == nil {
		return
	}
	m.powerPolls.WithLabelValues(result(err)).Inc()
}

func result(err error) string {
	if err != nil {
		return resultError
	}
	return resultOK
}

// opLabel is a capability as a label ("get power": get_power), without an allocation on the
// call's path. Pure.
func opLabel(capability string) string {
	switch capability {
	case capGetPower:
		return "get_power"
	case capSetPower:
		return "set_power"
	case capBoot:
		return "set_boot_device"
	case capInspect:
		return "inspect"
	case capFirmware:
		return "read_firmware_versions"
	case capRotate:
		return "rotate_credential"
	case capMedia:
		return "use_virtual_media"
	case capBIOS:
		return "change_bios_settings"
	case capFirmwareUpdate:
		return "update_firmware"
	}
	return strings.ReplaceAll(capability, " ", "_")
}

// bmcCapabilities are the operations BMC calls are counted by.
func bmcCapabilities() []string {
	return []string{capGetPower, capSetPower, capBoot, capInspect, capFirmware, capRotate, capMedia, capBIOS, capFirmwareUpdate}
}

// bmcFailure classifies a failed BMC call: the stage runDriver failed at, or the context's end
// for a call that ran out of time or was cancelled. "" when err is nil. Pure.
func bmcFailure(stage string, err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, context.DeadlineExceeded):
		return failTimeout
	case errors.Is(err, context.Canceled):
		return failCancelled
	}
	return stage
}

// bmcFailures are the reasons bmcFailure gives.
func bmcFailures() []string {
	return []string{failConnect, failUnsupported, failTimeout, failCancelled, failCall}
}

// Boot HTTP routes, as counted.
const (
	routeScript    = "script"
	routeArtifact  = "artifact"
	routeBinary    = "binary"
	routeMetadata  = "metadata"
	routeDiscovery = "discovery"
	routeDecision  = "decision"
	routeOther     = "other"
)

// routeOf is the route a boot HTTP request's path is counted under. Pure.
func routeOf(path string) string {
	switch {
	case path == netboot.ScriptPath:
		return routeScript
	case strings.HasPrefix(path, netboot.ArtifactPath):
		return routeArtifact
	case strings.HasPrefix(path, netboot.BinaryPath):
		return routeBinary
	case path == netboot.MetadataPath:
		return routeMetadata
	case path == netboot.DiscoveryPath:
		return routeDiscovery
	case path == netboot.DecisionPath:
		return routeDecision
	}
	return routeOther
}

// statusClass is a status code's class label (2xx…5xx). Pure.
func statusClass(code int) string {
	if code < 100 || code > 599 {
		return "other"
	}
	return strconv.Itoa(code/100) + "xx"
}

// bootHTTP counts the boot HTTP server's requests and the bytes of their responses (as they
// are written: a long download counts as it goes). Without metrics it is next itself.
func (m *metrics) bootHTTP(next http.Handler) http.Handler {
	if m == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route := routeOf(r.URL.Path)
		cw := &countedResponse{ResponseWriter: w, bytes: m.httpBytes.WithLabelValues(route)}
		next.ServeHTTP(cw, r)
		if cw.status == 0 {
			cw.status = http.StatusOK
		}
		m.httpReqs.WithLabelValues(route, statusClass(cw.status)).Inc()
	})
}

// countedResponse counts a response's bytes and keeps its status. It keeps the response's
// ReadFrom (artifacts go out by sendfile) and lets http.ResponseController reach it.
type countedResponse struct {
	http.ResponseWriter
	bytes  prometheus.Counter
	status int
}

func (c *countedResponse) WriteHeader(code int) {
	if c.status == 0 && code >= 200 {
		c.status = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *countedResponse) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	n, err := c.ResponseWriter.Write(p)
	c.bytes.Add(float64(n))
	return n, err
}

func (c *countedResponse) ReadFrom(r io.Reader) (int64, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	rf, ok := c.ResponseWriter.(io.ReaderFrom)
	if !ok {
		return io.Copy(struct{ io.Writer }{c}, r)
	}
	n, err := rf.ReadFrom(r)
	c.bytes.Add(float64(n))
	return n, err
}

// Unwrap lets http.ResponseController reach the connection's response.
func (c *countedResponse) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// dhcpCollector exports the DHCP service's counters at scrape time, every label of their fixed
// sets included (a rate starts from 0).
type dhcpCollector struct {
	c    *dhcp.Counters
	mode string
}

func dhcpDescs() (requests, replies, unanswered *prometheus.Desc) {
	return prometheus.NewDesc("bcd_site_dhcp_requests_total",
			"DHCP requests received while this agent served DHCP, by the agent's DHCP mode and message type (malformed: not DHCP).", []string{"mode", "type"}, nil),
		prometheus.NewDesc("bcd_site_dhcp_replies_total",
			"DHCP replies sent, by type (offer, ack, nak; proxy_offer and proxy_ack in proxy mode).", []string{"type"}, nil),
		prometheus.NewDesc("bcd_site_dhcp_unanswered_total",
			"DHCP requests that got no reply, by reason. A rising pool_exhausted or lease_not_saved rate means machines get no address; no_binary, firmware the agent has no iPXE binary for.", []string{"reason"}, nil)
}

func (d *dhcpCollector) Describe(ch chan<- *prometheus.Desc) {
	a, b, c := dhcpDescs()
	ch <- a
	ch <- b
	ch <- c
}

func (d *dhcpCollector) Collect(ch chan<- prometheus.Metric) {
	requests, replies, unanswered := dhcpDescs()
	for t := range dhcp.NumRequestTypes {
		ch <- prometheus.MustNewConstMetric(requests, prometheus.CounterValue, float64(d.c.Requests[t].Load()), d.mode, t.String())
	}
	for t := range dhcp.NumReplyTypes {
		ch <- prometheus.MustNewConstMetric(replies, prometheus.CounterValue, float64(d.c.Sent[t].Load()), t.String())
	}
	for u := range dhcp.NumUnanswered {
		ch <- prometheus.MustNewConstMetric(unanswered, prometheus.CounterValue, float64(d.c.Unanswered[u].Load()), u.String())
	}
}

// tftpCollector exports the TFTP server's counters at scrape time.
type tftpCollector struct{ c *tftp.Counters }

func tftpDescs() (served, bytes, failed *prometheus.Desc) {
	return prometheus.NewDesc("bcd_site_tftp_files_served_total", "Files (iPXE binaries) served whole over TFTP.", nil, nil),
		prometheus.NewDesc("bcd_site_tftp_sent_bytes_total", "Bytes of file data sent over TFTP (of failed transfers too).", nil, nil),
		prometheus.NewDesc("bcd_site_tftp_failures_total",
			"TFTP read requests not served whole, by reason: not_found, bad_name, busy (refused for the transfer bounds: a rising rate means a boot storm beyond them), transfer (the client stopped acknowledging).", []string{"reason"}, nil)
}

func (t *tftpCollector) Describe(ch chan<- *prometheus.Desc) {
	a, b, c := tftpDescs()
	ch <- a
	ch <- b
	ch <- c
}

func (t *tftpCollector) Collect(ch chan<- prometheus.Metric) {
	served, bytes, failed := tftpDescs()
	ch <- prometheus.MustNewConstMetric(served, prometheus.CounterValue, float64(t.c.Served.Load()))
	ch <- prometheus.MustNewConstMetric(bytes, prometheus.CounterValue, float64(t.c.Bytes.Load()))
	for f := range tftp.NumFailures {
		ch <- prometheus.MustNewConstMetric(failed, prometheus.CounterValue, float64(t.c.Failed[f].Load()), f.String())
	}
}

// serveMetrics serves /metrics and /healthz on ln until ctx ends; the function returned waits
// for the server's end.
func (m *metrics) serveMetrics(ctx context.Context, ln net.Listener, log *slog.Logger) (wait func()) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: httpHeaderTimeout, IdleTimeout: DefaultHTTPIdleTimeout}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving metrics stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), metricsShutdownTimeout)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
	}()
	return func() {
		<-stopped
		<-done
	}
}

// listenMetrics opens the metrics listener of addr ("" or "off": none).
func listenMetrics(addr string) (net.Listener, error) {
	if addr == "" || addr == "off" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening for metrics on %s: %w", addr, err)
	}
	return ln, nil
}
