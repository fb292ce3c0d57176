// Package server composes `bcd server`: the store, the sealing key, the node service, the public
// API and the metrics endpoint.
package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"bcd/internal/api"
	"bcd/internal/console"
	"bcd/internal/engine"
	"bcd/internal/gateway"
	"bcd/internal/metal"
	"bcd/internal/pki"
	"bcd/internal/provision"
	"bcd/internal/secrets"
	"bcd/internal/store"
	"bcd/internal/webui"
	"bcd/internal/workflow"
)

// Config is `bcd server`'s configuration.
type Config struct {
	Listen   string // host:port of the API (and /metrics, /healthz)
	DataDir  string // SQLite file and sealing key live here unless given
	StoreDSN string // sqlite:PATH or postgres://…; default sqlite:<data-dir>/bcd.db
	KeyFile  string // sealing key file; default <data-dir>/seal.key
	Key      string // sealing key in base64 (overrides KeyFile)
	// GatewayListen is the agent gateway's address (mTLS, HTTP/2); "off" runs none.
	GatewayListen string
	// GatewayURL is how agents reach the gateway (default https://<GatewayListen>).
	GatewayURL string
	// GatewayHosts are extra DNS names/IPs for the gateway's certificate.
	GatewayHosts []string
	// GatewayListener, when set, is where the gateway accepts agents, in place of
	// GatewayListen: bcd sim's in-memory network (memnet), whose agents dial it in the same
	// process. The server closes it when it stops.
	GatewayListener net.Listener
	// Engine tunes the reconciler.
	Engine engine.Config
	// ProfilesFile is a JSON object of operator-defined deploy profiles by name (each as
	// PutDeployProfile takes it); profiles stored through the API take precedence.
	ProfilesFile string
	// CARefresh is how often the server looks for a change of the installation's agent CAs (a
	// rotation's stage); default 5s.
	CARefresh time.Duration
	// APITLSCert and APITLSKey are the PEM files of the API's TLS certificate (chain) and key:
	// both, or neither for plain HTTP. The server loads them again when they change.
	APITLSCert, APITLSKey string
	// DebugListen is a loopback host:port serving Go's runtime profiles (CPU, heap, execution
	// trace: debugHandler); "" serves none.
	DebugListen string
	// WriterCPU counts the CPU time of SQLite's single writer (bcd_store_writer_cpu_seconds_total,
	// store.MeasureWriterCPU), which locks it to one OS thread at a cost to its throughput.
	WriterCPU bool
}

// loadProfiles reads the profiles file: operator-defined deploy profiles, and overrides of
// built-in metal-* profiles ({"override": {…}}, giving the overridden built-in profile, which
// workflow.Find then prefers to the built-in one).
func loadProfiles(path string) ([]workflow.Profile, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading deploy profiles: %w", err)
	}
	var defs map[string]json.RawMessage
	if err := json.Unmarshal(b, &defs); err != nil {
		return nil, fmt.Errorf("profiles file %s: expected a JSON object of profiles by name (deploy profiles, and {\"override\": {…}} under a built-in metal-* name): %w", path, err)
	}
	var out []workflow.Profile
	for _, name := range slices.Sorted(maps.Keys(defs)) {
		p, err := workflow.ParseProfile(name, defs[name])
		if err != nil {
			return nil, fmt.Errorf("profiles file %s: %w", path, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// Withdefaults fills the derived defaults.
func (c Config) WithDefaults() Config {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:7480"
	}
	if c.DataDir == "" {
		c.DataDir = "data"
	}
	if c.StoreDSN == "" {
		c.StoreDSN = "sqlite:" + filepath.Join(c.DataDir, "bcd.db")
	}
	if c.KeyFile == "" {
		c.KeyFile = filepath.Join(c.DataDir, "seal.key")
	}
	if c.GatewayListen == "" {
		c.GatewayListen = "127.0.0.1:7443"
	}
	if c.CARefresh <= 0 {
		c.CARefresh = caRefreshInterval
	}
	return c
}

// checkDataDir refuses a data directory that group or others may write in: they could replace
// the sealing key, the SQLite store or its watermark. One they may read is only warned about
// (the sealing key is refused on its own if readable; the store holds sealed secrets and
// hashes, and is created 0600). A directory that does not exist yet is created 0700.
func checkDataDir(dir string, log *slog.Logger) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("data dir: %w", err)
	case !st.IsDir():
		return fmt.Errorf("data dir %s is not a directory", dir)
	case st.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("data dir %s has mode %v: group or others may write in it and replace the sealing key, the store or its watermark (chmod go-w %s)", dir, st.Mode().Perm(), dir)
	case st.Mode().Perm()&0o077 != 0:
		log.Warn("the data dir is readable by group or others: the names in it are (chmod 700)", "dir", dir, "mode", st.Mode().Perm().String())
	}
	return nil
}

// Server is a running control plane.
type Server struct {
	cfg    Config
	log    *slog.Logger
	st     *store.Store
	svc    *metal.Service
	eng    *engine.Engine
	ca     *pki.CA
	cas    *caKeeper
	ln     net.Listener
	http   *http.Server
	first  string
	gwLn   net.Listener
	gwURL  string
	gwCert *pki.ServerCert
	gw     http.Handler
	// gwServer is the gateway behind gw: it serves gwLn and counts (Stats, /metrics).
	gwServer *gateway.Server
	// dbgLn serves the runtime's profiles (Config.DebugListen; nil: none).
	dbgLn net.Listener
	// apiCert is the API's TLS certificate (nil: plain HTTP).
	apiCert  *apiCert
	consoles *console.Hub
	// lock is the SQLite store's one-server lock (nil on PostgreSQL), released after the
	// store closes.
	lock io.Closer
}

// New opens the store and binds the listener.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Engine.Check(); err != nil {
		return nil, fmt.Errorf("configuring the engine: %w", err)
	}
	if cfg.DebugListen != "" {
		if err := checkDebugAddr(cfg.DebugListen); err != nil {
			return nil, err // before anything is opened or created
		}
	}
	apiCert, tlsErr := newAPICert(cfg.APITLSCert, cfg.APITLSKey, log)
	if tlsErr != nil {
		return nil, fmt.Errorf("loading the API's TLS certificate: %w", tlsErr)
	}
	if err := checkDataDir(cfg.DataDir, log); err != nil {
		return nil, err
	}
	var key secrets.Keyring
	var err error
	if cfg.Key != "" {
		key, err = secrets.ParseKeyring(cfg.Key)
	} else {
		key, err = secrets.LoadOrCreateKeyring(cfg.KeyFile)
	}
	if err != nil {
		return nil, fmt.Errorf("loading the sealing key: %w", err)
	}
	sealer, err := secrets.NewKeyringSealer(key)
	if err != nil {
		return nil, err
	}
	lock, err := store.LockSQLite(cfg.StoreDSN)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started && lock != nil {
			lock.Close()
		}
	}()
	st, err := store.Open(ctx, cfg.StoreDSN)
	if err != nil {
		return nil, err
	}
	st.MeasureWriterCPU(cfg.WriterCPU)
	marks := &watermarkKeeper{path: filepath.Join(cfg.DataDir, watermarkName), log: log}
	if err := checkWatermark(ctx, st, marks.path, log); err != nil {
		st.Close()
		return nil, err
	}
	if err := secrets.CheckStore(ctx, st, sealer); err != nil {
		st.Close()
		return nil, err
	}
	svc := metal.New(st, sealer, log)
	first, err := svc.Bootstrap(ctx)
	if err != nil {
		st.Close()
		return nil, err
	}
	ca, err := installationCA(ctx, st, sealer, filepath.Join(cfg.DataDir, "ca"), log)
	if err != nil {
		st.Close()
		return nil, err
	}
	cas := &caKeeper{st: st, sealer: sealer, ca: ca, log: log}
	if err := cas.refresh(ctx); err != nil {
		st.Close()
		return nil, err
	}
	profiles, err := loadProfiles(cfg.ProfilesFile)
	if err != nil {
		st.Close()
		return nil, err
	}
	svc.SetProfiles(profiles)
	ecfg := cfg.Engine
	if ecfg.Name == "" {
		ecfg.Name, _ = os.Hostname() // "" falls back to the engine's default
	}
	svc.SetApprovalTimeout(ecfg.ApprovalTimeout) // 0: the default, as the engine's
	durations := newDurations()
	ecfg.Observer = durations
	ecfg.Secrets = svc
	ecfg.AutoEnroll = svc.AutoEnrollInband
	ecfg.Watermarks = marks.save
	ecfg.Profiles = append(ecfg.Profiles, profiles...)
	withGateway := cfg.GatewayListener != nil || cfg.GatewayListen != "off"
	ecfg.RelayConsoles = withGateway // no gateway: no agent can relay a console
	eng := engine.New(st, ca, log, ecfg)
	consoles := eng.Consoles()
	svc.OnWake(eng.Nudge)
	s := &Server{cfg: cfg, log: log, st: st, svc: svc, eng: eng, ca: ca, cas: cas, first: first, lock: lock, apiCert: apiCert}
	if withGateway {
		if err := s.listenGateway(); err != nil {
			st.Close()
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		st.Close()
		if s.gwLn != nil {
			s.gwLn.Close()
		}
		return nil, fmt.Errorf("listening on %s: %w", cfg.Listen, err)
	}
	s.ln = ln
	if cfg.DebugListen != "" {
		if s.dbgLn, err = listenDebug(cfg.DebugListen); err != nil {
			st.Close()
			ln.Close()
			if s.gwLn != nil {
				s.gwLn.Close()
			}
			return nil, err
		}
	}
	var joiner api.SiteJoiner
	if s.gwLn != nil {
		joiner = s
	}
	s.consoles = consoles
	mux := http.NewServeMux()
	mux.Handle("/", api.Handler(svc, joiner, eng, consoles, log))
	// The operator's web UI (docs/webui.md), on the API's listener and its TLS.
	mux.Handle(webui.Prefix, webui.New(webui.Config{Service: svc, Verifier: eng, Secure: apiCert != nil, Log: log, Consoles: consoles}))
	mux.HandleFunc("/ui", webui.Redirect)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newNodeCollector(st), newQueueCollector(st),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_commands_lost_total",
			Help: "Commands recorded as lost since the server started: acknowledged by an agent that went away, or reported interrupted by an agent's restart. A rising rate means agents are dying."},
			func() float64 { return float64(eng.CommandsLost()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_reconciliations_total",
			Help: "Node reconciliations this server ran since it started. Servers sharing a store split them; one whose rate stays at zero does no work."},
			func() float64 { return float64(eng.Reconciliations()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_reconcile_failures_total",
			Help: "Node reconciliations that failed (rolled back, retried with back-off) since the server started. A node that keeps failing gets RECONCILE_FAILED."},
			func() float64 { return float64(eng.ReconcileFailures()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_reconcile_faults_total",
			Help: "RECONCILE_FAILED faults this server raised since it started: nodes left in maintenance for an operator (bcd doctor lists them)."},
			func() float64 { return float64(eng.ReconcileFaults()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bcd_console_sessions",
			Help: "Operators' serial-console sessions open on this server (bcd node console)."},
			func() float64 {
				if consoles == nil {
					return 0
				}
				return float64(consoles.Count())
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_engine_cpu_gate_admissions_total",
			Help: "Pieces of CPU-heavy work done for agents beside the store's writer (a joining node's certificate, an attested result's signature, a claim's candidates on SQLite) since the server started; they run through a gate of GOMAXPROCS-1 slots."},
			func() float64 { return float64(eng.CPUGate().Admitted) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_engine_cpu_gate_wait_seconds_total",
			Help: "Time that work waited for a slot of the CPU gate, summed: over bcd_engine_cpu_gate_admissions_total, the mean wait, which grows when the server's processors are short."},
			func() float64 { return eng.CPUGate().Waited.Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_engine_cpu_gate_busy_seconds_total",
			Help: "Time the CPU gate's slots were held, summed: its rate over the number of slots (GOMAXPROCS-1) is how full the gate is."},
			func() float64 { return eng.CPUGate().Busy.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "bcd_engine_cpu_gate_slots",
			Help: "Slots of the CPU gate: pieces of CPU-heavy agent work that run at once."},
			func() float64 { return float64(eng.CPUGate().Slots) }),
		durations.commands, durations.waits, durations.workflows)
	if s.gwServer != nil {
		reg.MustRegister(newGatewayCollector(s.gwServer))
	}
	if st.Engine() == store.SQLite {
		reg.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_writer_busy_seconds_total",
				Help: "Time SQLite's single writer spent running and committing groups of writes. Its rate is the writer's load: near 1, the store is at its capacity and writes wait in its queue."},
				func() float64 { return st.WriterStats().Busy.Seconds() }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_writer_cpu_seconds_total",
				Help: "CPU time the writer's thread used while it was busy: its busy time less its waits for a processor. Counted only with --writer-cpu (0 without, and where the platform does not tell)."},
				func() float64 { return st.WriterStats().CPU.Seconds() }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_writes_total",
				Help: "Writes (transactions) SQLite's single writer committed."},
				func() float64 { return float64(st.WriterStats().Writes) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_writer_commits_total",
				Help: "Commits of SQLite's single writer: each takes the writes that queued while the one before ran (bcd_store_writes_total divided by it is the writes a commit shared)."},
				func() float64 { return float64(st.WriterStats().Groups) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_writer_statements_total",
				Help: "SQL statements SQLite's single writer ran, its transactions' BEGIN and COMMIT included: a count of its work that does not depend on how fast the machine is."},
				func() float64 { return float64(st.WriterStats().Statements) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_writer_reprepares_total",
				Help: "Times SQLite prepared one of its writer's statements again as it ran: a few of SQLite's own (after a schema change, the checkpoint before a WAL restart); growing with the writes, a statement whose plan hangs on a value bound to it (a bug: tens of microseconds of the writer each time)."},
				func() float64 { return float64(st.WriterStats().Reprepares) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_wal_pages_total",
				Help: "Pages SQLite's writer's commits wrote to the write-ahead log (a page it changed once a commit): its rate times the page size (4 KiB) is the store's write load on its disk, before checkpoints copy them into the database file."},
				func() float64 { return float64(st.WriterStats().WALPages) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_wal_restarts_total",
				Help: "Times the writer restarted SQLite's write-ahead log once it passed its limit (64 MiB) while writes went on."},
				func() float64 { return float64(st.WriterStats().WALRestarts) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_wal_restarts_waited_total",
				Help: "Restarts of SQLite's write-ahead log for which the writer waited for readers to leave it (others cost it only the copy of what the checkpointer had not copied yet)."},
				func() float64 { return float64(st.WriterStats().WALRestartsWaited) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_writer_reruns_total",
				Help: "Groups of writes SQLite's writer rolled back and ran again, with a savepoint around each write from the one that failed on: a group runs without savepoints until a write of it fails. A rate near its groups' means most groups hold a write that fails."},
				func() float64 { return float64(st.WriterStats().Reruns) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_wal_flushes_total",
				Help: "Flushes of SQLite's write-ahead log to disk (fdatasync) that answered committed writes: each takes every group the writer committed before it."},
				func() float64 { return float64(st.WriterStats().Flushes) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "bcd_store_wal_flush_seconds_total",
				Help: "Time those flushes took, beside the writer. Divided by bcd_store_wal_flushes_total, the disk's flush latency, which every write's answer waits for."},
				func() float64 { return st.WriterStats().FlushTime.Seconds() }))
	}
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	// HTTP/2 without TLS (gRPC clients) is served by net/http itself, not by a handler that
	// hijacks the connection: Shutdown then ends those connections too, before the store closes.
	// Over TLS, HTTP/2 is negotiated (ALPN).
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	var tlsConfig *tls.Config
	if apiCert != nil {
		protocols.SetHTTP2(true)
		tlsConfig = apiCert.tlsConfig()
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	s.http = &http.Server{
		Handler:           mux,
		Protocols:         &protocols,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       apiIdleTimeout,
		MaxHeaderBytes:    64 << 10,
		// Failed TLS handshakes (a client that does not trust the certificate) are not the
		// server's errors: debug, not the process's standard log.
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	started = true
	return s, nil
}

// Addr is the API's address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// DebugAddr is the address serving the runtime's profiles ("" when there is none).
func (s *Server) DebugAddr() string {
	if s.dbgLn == nil {
		return ""
	}
	return s.dbgLn.Addr().String()
}

// URL is the API's base URL (https:// with a TLS certificate).
func (s *Server) URL() string {
	if s.apiCert != nil {
		return "https://" + s.Addr()
	}
	return "http://" + s.Addr()
}

// FirstAdminToken is the admin token minted at first start ("" afterwards): show it once.
func (s *Server) FirstAdminToken() string { return s.first }

// Service is the node service (in-process callers: sim, tests).
func (s *Server) Service() *metal.Service { return s.svc }

// Consoles holds the operators' console sessions open on this server (nil without a gateway).
func (s *Server) Consoles() *console.Hub { return s.consoles }

// apiIdleTimeout closes an API client's keep-alive connection that has carried no request for
// this long: idle connections of clients that went away do not pile up.
const apiIdleTimeout = 2 * time.Minute

// gatewayCertTTL is the life of the gateway's server certificate; it is renewed after two
// thirds of it (pki.ServerCert).
const gatewayCertTTL = 90 * 24 * time.Hour

// listenGateway binds the agent gateway with a server certificate from the CA.
func (s *Server) listenGateway() error {
	ln := s.cfg.GatewayListener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", s.cfg.GatewayListen); err != nil {
			return fmt.Errorf("listening for agents on %s: %w", s.cfg.GatewayListen, err)
		}
	}
	host, _, _ := net.SplitHostPort(ln.Addr().String())
	hosts := append([]string{host, "localhost", "127.0.0.1"}, s.cfg.GatewayHosts...)
	if s.cfg.GatewayURL != "" {
		if u, err := url.Parse(s.cfg.GatewayURL); err == nil && u.Hostname() != "" {
			hosts = append(hosts, u.Hostname())
		}
	}
	cert, err := pki.NewServerCert(s.ca, hosts, gatewayCertTTL, nil)
	if err != nil {
		ln.Close()
		return fmt.Errorf("issuing the gateway's certificate: %w", err)
	}
	gw, err := gateway.New(gateway.Config{Queue: s.eng.Gateway(), Identities: s.eng.Gateway(), Sites: s.eng.Gateway(), Consoles: s.eng.Gateway(), CA: s.ca, Logger: s.log,
		Watermark: s.eng.Gateway().Watermark})
	if err != nil {
		ln.Close()
		return err
	}
	_, h := gw.Handler()
	s.gwLn, s.gwCert, s.gw, s.gwServer = ln, cert, s.eng.Gateway().Wrap(h), gw
	s.gwURL = s.cfg.GatewayURL
	if s.gwURL == "" {
		s.gwURL = "https://" + ln.Addr().String()
	}
	return nil
}

// GatewayURL is where agents connect ("" without a gateway).
func (s *Server) GatewayURL() string { return s.gwURL }

// CAPEM is the CAs agents trust (two during a rotation of the agent CA).
func (s *Server) CAPEM() []byte { return s.ca.CertPEM() }

// CreateSiteJoinToken mints a site agent's bootstrap token.
func (s *Server) CreateSiteJoinToken(ctx context.Context, siteID string, ttl time.Duration) (string, error) {
	return s.eng.CreateSiteJoinToken(ctx, siteID, ttl)
}

// Engine is the reconciler (tests, tools).
func (s *Server) Engine() *engine.Engine { return s.eng }

// Serve runs the API, the agent gateway and the reconciler until ctx ends, then shuts down
// gracefully.
func (s *Server) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A heartbeat before agents can connect: after an outage of the control plane it gives the
	// steps in progress their time back before an agent's arrival or report reconciles a node.
	if err := s.eng.Heartbeat(ctx); err != nil {
		s.log.Error("recording that this server is alive", "error", err)
	}
	errc := make(chan error, 3)
	go func() {
		if s.apiCert != nil {
			errc <- s.http.ServeTLS(s.ln, "", "") // the certificate: TLSConfig.GetCertificate
			return
		}
		errc <- s.http.Serve(s.ln)
	}()
	go func() { errc <- s.eng.Run(ctx) }()
	caDone := make(chan struct{})
	go func() { defer close(caDone); s.cas.run(ctx, s.cfg.CARefresh) }()
	running := 2
	if s.gwLn != nil {
		running++
		go func() {
			errc <- s.gwServer.Serve(ctx, s.gwLn, s.gwCert, s.gw, s.log)
		}()
	}
	if s.dbgLn != nil {
		// Its own server, closed at shutdown (a profile in progress is cut off there).
		dbg := &http.Server{Handler: debugHandler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
		go dbg.Serve(s.dbgLn)
		defer dbg.Close()
		s.log.Info("serving runtime profiles", "debug", "http://"+s.DebugAddr()+"/debug/pprof/")
	}
	if s.warnInClear() {
		s.log.Warn("the API is served over plain HTTP on an address other hosts reach: API tokens and BMC passwords cross the network in clear; "+
			"give --api-tls-cert and --api-tls-key, or listen on loopback behind a TLS-terminating proxy", "api", s.URL())
	}
	s.log.Info("bcd server listening", "api", s.URL(), "gateway", s.gwURL, "store", string(s.st.Engine()), "server", s.eng.ID(), "ca", s.ca.Fingerprint())
	var err error
	select {
	case err = <-errc:
		running--
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("serving: %w", err)
		}
	case <-ctx.Done():
	}
	cancel()
	<-caDone
	shutCtx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	if s.consoles != nil {
		s.consoles.Shutdown() // their streams end now, not at the shutdown's deadline
	}
	err = errors.Join(err, s.http.Shutdown(shutCtx))
	for range running {
		if e := <-errc; e != nil && !errors.Is(e, http.ErrServerClosed) && !errors.Is(e, context.Canceled) {
			err = errors.Join(err, e)
		}
	}
	err = errors.Join(err, s.st.Close())
	if s.lock != nil {
		err = errors.Join(err, s.lock.Close())
	}
	return err
}

// exposedInClear says whether the API's listener, plain HTTP, is reachable from other hosts (an
// address other than loopback, or every address).
func exposedInClear(addr net.Addr) bool {
	tcp, ok := addr.(*net.TCPAddr)
	return ok && !tcp.IP.IsLoopback()
}

// durations exports how long commands and workflows took (engine.Observer), as histograms, and
// how long commands waited for an agent.
type durations struct {
	commands, waits, workflows *prometheus.HistogramVec
}

func newDurations() *durations {
	// From a quick BMC query (tens of ms) to a full wipe or an image write (hours).
	buckets := prometheus.ExponentialBuckets(0.01, 4, 12)
	return &durations{
		commands: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "bcd_command_duration_seconds",
			Help: "Commands from queued to their final state, by kind and state (succeeded, failed, lost).", Buckets: buckets}, []string{"kind", "state"}),
		// From an agent waiting on its stream (a millisecond) to one that is away or swamped
		// (minutes), each bound twice the last: a quantile read from them (histogram_quantile,
		// bcd sim --server) is placed within a bucket, so the narrower they are the closer it
		// is (a 4-fold bucket put a wait of 1.1 s anywhere between 1 and 4 s).
		waits: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "bcd_command_queue_wait_seconds",
			Help:    "Commands from queued to an agent's acknowledgement, by kind, observed when they end: a site whose agents fall behind shows here first.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 20)}, []string{"kind"}),
		workflows: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "bcd_workflow_duration_seconds",
			Help: "Workflows from start to end, by profile and state (succeeded, failed, aborted).", Buckets: buckets}, []string{"profile", "state"}),
	}
}

func (d *durations) CommandFinished(kind, state string, waited, took time.Duration) {
	d.commands.WithLabelValues(kind, state).Observe(took.Seconds())
	if waited >= 0 {
		d.waits.WithLabelValues(kind).Observe(waited.Seconds())
	}
}

func (d *durations) WorkflowFinished(profile, state string, took time.Duration) {
	d.workflows.WithLabelValues(profile, state).Observe(took.Seconds())
}

// nodeCollector exports nodes per state at scrape time.
type nodeCollector struct {
	st   *store.Store
	desc *prometheus.Desc
}

// gatewayCollector exposes the agent gateway's counts (gateway.Stats).
type gatewayCollector struct {
	gw                                     *gateway.Server
	conns, open, tlsFailures               *prometheus.Desc
	joins, joinsRefused                    *prometheus.Desc
	streams, streamsOpened, streamsRefused *prometheus.Desc
	commandsSent, updates                  *prometheus.Desc
}

func newGatewayCollector(gw *gateway.Server) *gatewayCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &gatewayCollector{gw: gw,
		conns: d("bcd_gateway_connections_total", "TCP connections the agent gateway accepted since the server started. Each agent boot makes two (its join, then its stream): a rate well above the boots' means agents reconnecting."),
		open:  d("bcd_gateway_connections", "Connections open on the agent gateway now: about one per connected agent. Each holds a file descriptor."),
		tlsFailures: d("bcd_gateway_tls_failures_total",
			"Connections to the agent gateway that closed before their TLS handshake completed: a client certificate its CAs did not sign or that expired, or a client that is not an agent."),
		joins:         d("bcd_gateway_joins_total", "Agents that joined (traded a join token for a certificate) since the server started, by kind: site-agent, node (a ramdisk or an installed OS).", "kind"),
		joinsRefused:  d("bcd_gateway_join_refusals_total", "Joins refused since the server started: a token unknown, used or expired (one answer for all three), a bad request, or the store out. A steady rate with no boots is someone guessing tokens."),
		streams:       d("bcd_gateway_streams", "Agents' streams open on this server now, by the kind of their certificate: site-agent, node (a ramdisk), node-tenant (a lessee's installed OS).", "kind"),
		streamsOpened: d("bcd_gateway_streams_opened_total", "Agents' streams admitted since the server started, by the kind of their certificate.", "kind"),
		streamsRefused: d("bcd_gateway_stream_refusals_total",
			"Streams refused since the server started: a revoked site agent or identity generation, an unknown node, a certificate of another kind."),
		commandsSent: d("bcd_gateway_commands_sent_total", "Commands the gateway sent down agents' streams since the server started."),
		updates:      d("bcd_gateway_command_updates_total", "Command updates (progress and results) agents sent up since the server started."),
	}
}

func (c *gatewayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.conns, c.open, c.tlsFailures, c.joins, c.joinsRefused, c.streams, c.streamsOpened, c.streamsRefused, c.commandsSent, c.updates} {
		ch <- d
	}
}

func (c *gatewayCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.gw.Stats()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	counter(c.conns, st.Connections)
	gauge(c.open, st.OpenConnections)
	counter(c.tlsFailures, st.TLSFailures)
	counter(c.joinsRefused, st.JoinsRefused)
	counter(c.streamsRefused, st.StreamsRefused)
	counter(c.commandsSent, st.CommandsSent)
	counter(c.updates, st.Updates)
	for _, kind := range slices.Sorted(maps.Keys(st.Streams)) {
		gauge(c.streams, st.Streams[kind], kind)
		counter(c.streamsOpened, st.StreamsOpened[kind], kind)
	}
	for _, kind := range slices.Sorted(maps.Keys(st.Joins)) {
		counter(c.joins, st.Joins[kind], kind)
	}
}

// queueCollector exports, at scrape time, the commands waiting for an agent by site and by the
// agents they run on (store.QueueDepths, doctor's queues), and how long the oldest has waited.
// Sites are named by id: /metrics answers without a token, and a site's name is its tenant's.
type queueCollector struct {
	st             *store.Store
	queued, oldest *prometheus.Desc
}

func newQueueCollector(st *store.Store) *queueCollector {
	return &queueCollector{st: st,
		queued: prometheus.NewDesc("bcd_commands_queued",
			"Commands waiting for an agent to take them (queued, not yet acknowledged), by site id (bcd site list names them) and the agents they run on (site: its site agents; ramdisk: the nodes' own). Sites with none are left out; every server sharing the store gives the same.",
			[]string{"site_id", "runs_on"}, nil),
		oldest: prometheus.NewDesc("bcd_commands_queued_oldest_seconds",
			"How long the oldest of those commands has waited, by site id and the agents they run on: a site agents' figure that keeps growing is a site whose agents are away or fall behind.",
			[]string{"site_id", "runs_on"}, nil)}
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.queued; ch <- c.oldest }

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	depths, err := c.st.QueueDepths(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.queued, err)
		return
	}
	now := time.Now().UnixMicro()
	for _, d := range depths {
		ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(d.Commands), d.SiteID, d.RunsOn)
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, float64(max(now-d.Oldest, 0))/1e6, d.SiteID, d.RunsOn)
	}
}

func newNodeCollector(st *store.Store) *nodeCollector {
	return &nodeCollector{st: st, desc: prometheus.NewDesc("bcd_nodes", "Nodes per provision state.", []string{"state"}, nil)}
}

func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := c.st.CountByState(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.desc, err)
		return
	}
	for _, s := range provision.States() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(counts[string(s)]), string(s))
	}
}
