// Package server composes `bcd server`: the store, the sealing key, the node service, the public
// API and the metrics endpoint.
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	"bcd/internal/api"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/secrets"
	"bcd/internal/store"
)

// Config is `bcd server`'s configuration.
type Config struct {
	Listen   string // host:port of the API (and /metrics, /healthz)
	DataDir  string // SQLite file and sealing key live here unless given
	StoreDSN string // sqlite:PATH or postgres://…; default sqlite:<data-dir>/bcd.db
	KeyFile  string // sealing key file; default <data-dir>/seal.key
	Key      string // sealing key in base64 (overrides KeyFile)
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
	return c
}

// Server is a running control plane.
type Server struct {
	cfg   Config
	log   *slog.Logger
	st    *store.Store
	svc   *metal.Service
	ln    net.Listener
	http  *http.Server
	first string
}

// New opens the store and binds the listener.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Server, error) {
	cfg = cfg.WithDefaults()
	var key []byte
	var err error
	if cfg.Key != "" {
		key, err = secrets.ParseKey(cfg.Key)
	} else {
		key, err = secrets.LoadOrCreateKey(cfg.KeyFile)
	}
	if err != nil {
		return nil, fmt.Errorf("loading the sealing key: %w", err)
	}
	sealer, err := secrets.NewSealer(key)
	if err != nil {
		return nil, err
	}
	st, err := store.Open(ctx, cfg.StoreDSN)
	if err != nil {
		return nil, err
	}
	svc := metal.New(st, sealer, log)
	first, err := svc.Bootstrap(ctx)
	if err != nil {
		st.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("listening on %s: %w", cfg.Listen, err)
	}
	s := &Server{cfg: cfg, log: log, st: st, svc: svc, ln: ln, first: first}
	mux := http.NewServeMux()
	mux.Handle("/", api.Handler(svc, log))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), newNodeCollector(st))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	s.http = &http.Server{
		Handler:           h2c.NewHandler(mux, &http2.Server{}),
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	return s, nil
}

// Addr is the API's address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL is the API's base URL.
func (s *Server) URL() string { return "http://" + s.Addr() }

// FirstAdminToken is the admin token minted at first start ("" afterwards): show it once.
func (s *Server) FirstAdminToken() string { return s.first }

// Service is the node service (in-process callers: sim, tests).
func (s *Server) Service() *metal.Service { return s.svc }

// Serve runs until ctx ends, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.http.Serve(s.ln) }()
	s.log.Info("bcd server listening", "api", s.URL(), "store", string(s.st.Engine()))
	select {
	case err := <-errc:
		s.st.Close()
		return fmt.Errorf("serving the API: %w", err)
	case <-ctx.Done():
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.http.Shutdown(shutCtx)
	if e := <-errc; !errors.Is(e, http.ErrServerClosed) {
		err = errors.Join(err, e)
	}
	return errors.Join(err, s.st.Close())
}

// nodeCollector exports nodes per state at scrape time.
type nodeCollector struct {
	st   *store.Store
	desc *prometheus.Desc
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
