package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"runtime/trace"

	"github.com/spf13/cobra"

	"bcd/internal/bench"
	"bcd/internal/server"
)

func benchCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "bench", Short: "Measure bcd on this machine"}
	var cfg bench.APIConfig
	var storeDSN string
	var asJSON bool
	var profile string
	api := &cobra.Command{
		Use:   "api [--nodes 10000] [--clients 8] [--store DSN]",
		Short: "Enroll N nodes over the real API with concurrent clients, then list them",
		Long: "Starts a server on loopback with a fresh store (SQLite in a temporary directory, or the " +
			"PostgreSQL DSN given with --store), or targets --server with --token when --external is set.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if err := checkBenchAPI(cfg.Nodes, cfg.Clients); err != nil {
				return err
			}
			stop, err := startCPUProfile(profile)
			if err != nil {
				return err
			}
			defer stop()
			external, _ := cmd.Flags().GetBool("external")
			if external {
				tlsConfig, err := g.apiTLS()
				if err != nil {
					return err
				}
				cfg.BaseURL, cfg.Token, cfg.TLS = g.server, g.apiToken(), tlsConfig
			} else {
				dir, err := os.MkdirTemp("", "bcd-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				srv, err := server.New(ctx, server.Config{Listen: "127.0.0.1:0", GatewayListen: "off", DataDir: dir, StoreDSN: storeDSN}, slog.New(slog.NewTextHandler(io.Discard, nil)))
				if err != nil {
					return err
				}
				sctx, cancel := context.WithCancel(ctx)
				errc := make(chan error, 1)
				go func() { errc <- srv.Serve(sctx) }()
				defer func() { cancel(); <-errc }()
				cfg.BaseURL, cfg.Token = srv.URL(), srv.FirstAdminToken()
				if cfg.Token == "" {
					return fmt.Errorf("the store given with --store is not empty: give a fresh database")
				}
			}
			cfg.Progress = func(done, total int) {
				if !asJSON {
					fmt.Fprintf(g.env.Stderr, "\renrolled %d/%d", done, total)
				}
			}
			res, err := bench.RunAPI(ctx, cfg)
			if !asJSON {
				fmt.Fprintln(g.env.Stderr)
			}
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(g.env.Stdout).Encode(res)
			}
			fmt.Fprintln(g.env.Stdout, res)
			return nil
		},
	}
	api.Flags().IntVar(&cfg.Nodes, "nodes", 10000, "nodes to enroll")
	api.Flags().IntVar(&cfg.Clients, "clients", 8, "concurrent API clients")
	api.Flags().StringVar(&storeDSN, "store", "", "store DSN of the server under test (default: SQLite in a temporary directory)")
	api.Flags().Bool("external", false, "measure the server at --server with --token instead of starting one")
	api.Flags().BoolVar(&asJSON, "json", false, "print the figures as JSON")
	api.Flags().StringVar(&profile, "cpuprofile", "", "write a CPU profile of the whole run (server and clients) to this file")
	cmd.AddCommand(api)
	return cmd
}

// checkBenchAPI refuses counts bcd bench api cannot run with, in the flags' terms.
func checkBenchAPI(nodes, clients int) error {
	switch {
	case nodes < 1:
		return usagef("--nodes %d: accepted is 1 or more", nodes)
	case clients < 1:
		return usagef("--clients %d: accepted is 1 or more", clients)
	}
	return nil
}

// startCPUProfile writes a CPU profile to path until stop is called; an empty path profiles
// nothing.
func startCPUProfile(path string) (stop func(), err error) {
	return startRecording(path, "CPU profile", pprof.StartCPUProfile, pprof.StopCPUProfile)
}

// startTrace writes a runtime execution trace (go tool trace) to path until stop; "" does nothing.
func startTrace(path string) (stop func(), err error) {
	return startRecording(path, "execution trace", trace.Start, trace.Stop)
}

// startAllocsProfile writes, when stop is called, a profile of the heap allocations made since
// the process started (go tool pprof -sample_index=alloc_space) to path, and says on errw if
// that failed; "" does nothing.
func startAllocsProfile(path string, errw io.Writer) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("creating allocations profile: %w", err)
	}
	return func() {
		err := pprof.Lookup("allocs").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			fmt.Fprintf(errw, "writing allocations profile %s: %v\n", path, err)
		}
	}, nil
}

func startRecording(path, what string, start func(io.Writer) error, end func()) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", what, err)
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", what, err)
	}
	return func() {
		end()
		f.Close()
	}, nil
}
