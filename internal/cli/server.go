package cli

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"bcd/internal/engine"
	"bcd/internal/flagconfig"
	"bcd/internal/server"
	"bcd/internal/workflow"
)

func serverCmd(g *globals) *cobra.Command {
	var cfg server.Config
	var logLevel, budget string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the control plane (API, store, reconciler)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := configure(g, cmd, serverSpec()); err != nil {
				return err
			}
			log, err := newLogger(g.env.Stderr, logLevel)
			if err != nil {
				return err
			}
			mem, err := startMemoryBudget(g, budget, log)
			if err != nil {
				return err
			}
			defer mem.Stop()
			cfg.Key = g.env.Getenv("BCD_SEAL_KEY")
			if fw := cfg.Engine.FastTrackWindow; fw < 0 || fw > workflow.MaxFastTrackWindow {
				return usagef("--fast-track-window %s: use a duration from 0s (off) to %s", fw, workflow.MaxFastTrackWindow)
			}
			for _, r := range []struct {
				flag string
				v    *time.Duration
			}{{"--history-retention", &cfg.Engine.HistoryRetention}, {"--event-retention", &cfg.Engine.EventRetention}} {
				switch {
				case *r.v == 0:
					*r.v = -1 // kept for ever
				case *r.v < engine.MinRetention:
					return usagef("%s %s: use %s or more, or 0 to keep it for ever", r.flag, *r.v, engine.MinRetention)
				}
			}
			if (cfg.APITLSCert == "") != (cfg.APITLSKey == "") {
				return usagef("--api-tls-cert and --api-tls-key go together: give both (the API over TLS) or neither (plain HTTP)")
			}
			srv, err := server.New(cmd.Context(), cfg, log)
			if err != nil {
				return err
			}
			out := g.env.Stdout
			fmt.Fprintf(out, "bcd server: API at %s, agent gateway at %s\n", srv.URL(), srv.GatewayURL())
			if tok := srv.FirstAdminToken(); tok != "" {
				fmt.Fprintf(out, "first start: admin token (shown once, store it now):\n\n  export BCD_SERVER=%s BCD_TOKEN=%s\n\n", srv.URL(), tok)
			}
			return srv.Serve(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:7480", "API listen address (env BCD_LISTEN)")
	f.StringVar(&cfg.DataDir, "data-dir", "data", "data directory: SQLite store and sealing key (env BCD_DATA_DIR)")
	// The environment is read after parsing, not shown as the flag's default: help must not print
	// the password a DSN may hold.
	f.StringVar(&cfg.StoreDSN, "store", "", "store DSN: sqlite:PATH or postgres://… (default: env BCD_STORE, else sqlite:DATA-DIR/bcd.db)")
	f.StringVar(&cfg.KeyFile, "seal-key-file", "", "sealing key file, created 0600 on first start (env BCD_SEAL_KEY_FILE; default DATA-DIR/seal.key; BCD_SEAL_KEY gives the key, or keyring, itself)")
	f.StringVar(&cfg.GatewayListen, "gateway-listen", "127.0.0.1:7443", "agent gateway listen address, mTLS (env BCD_GATEWAY_LISTEN; \"off\" for none)")
	f.StringVar(&cfg.GatewayURL, "gateway-url", "", "URL agents use to reach the gateway (env BCD_GATEWAY_URL; default https://GATEWAY-LISTEN)")
	f.StringSliceVar(&cfg.GatewayHosts, "gateway-host", nil, "extra DNS name or IP in the gateway's certificate (repeatable)")
	f.StringVar(&cfg.APITLSCert, "api-tls-cert", "", "PEM certificate chain of the API's TLS, with --api-tls-key; loaded again when the file changes (env BCD_API_TLS_CERT; default: plain HTTP)")
	f.StringVar(&cfg.APITLSKey, "api-tls-key", "", "PEM private key of --api-tls-cert; loaded again when the file changes (env BCD_API_TLS_KEY)")
	f.StringVar(&cfg.ProfilesFile, "profiles-file", "", "JSON object of deploy profiles by name (env BCD_PROFILES_FILE)")
	f.IntVar(&cfg.Engine.UnreachableAfter, "bmc-unreachable-after", engine.DefaultUnreachableAfter, "consecutive failed power polls that raise BMC_UNREACHABLE on a node")
	f.DurationVar(&cfg.Engine.FastTrackWindow, "fast-track-window", 0, "how long a ramdisk stays up after commissioning, release or inspection for a deploy to use it without a boot, where the node's pool sets no fastTrackWindow (0: off, the BMC powers the node off at once)")
	f.DurationVar(&cfg.Engine.ApprovalTimeout, "approval-timeout", engine.DefaultApprovalTimeout, "how long a destructive batch may wait for its approvals before it is rejected (its nodes return where their verb came from, or fail BATCH_REJECTED)")
	f.DurationVar(&cfg.Engine.QueueTimeout, "queue-timeout", engine.DefaultQueueTimeout, "how long a step's command may wait for an agent to take it before the step fails (its own timeout runs from when an agent takes it)")
	f.DurationVar(&cfg.Engine.HistoryRetention, "history-retention", engine.DefaultHistoryRetention, "how long ended workflows and their finished commands are kept (signed results, wipe proofs among them, are kept for ever; 0: everything for ever)")
	f.DurationVar(&cfg.Engine.EventRetention, "event-retention", engine.DefaultEventRetention, "how long events, and the decided batches (approvals) nothing names any more, are kept (0: for ever)")
	f.DurationVar(&cfg.Engine.SiteCertTTL, "site-cert-ttl", engine.DefaultSiteCertTTL, "lifetime of site agents' certificates (renewed after two thirds of it, at most 2 years)")
	f.DurationVar(&cfg.Engine.NodeCertTTL, "node-cert-ttl", engine.DefaultNodeCertTTL, "lifetime of ramdisks' certificates (renewed after two thirds of it, at most 2 years)")
	f.DurationVar(&cfg.Engine.OSCertTTL, "os-cert-ttl", engine.DefaultOSCertTTL, "lifetime of installed OSes' certificates: how long a deployed machine may stay off and still reconnect (at most 2 years)")
	f.StringVar(&cfg.DebugListen, "debug-listen", "", "loopback host:port serving Go's runtime profiles for go tool pprof: /debug/pprof/profile, heap, allocs, goroutine, trace (env BCD_DEBUG_LISTEN; default: none)")
	f.BoolVar(&cfg.WriterCPU, "writer-cpu", false, "count the CPU time of SQLite's single writer (bcd_store_writer_cpu_seconds_total): locks it to one OS thread, which costs it about 8 % of its throughput (env BCD_WRITER_CPU)")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error (env BCD_LOG_LEVEL)")
	f.StringVar(&budget, "memory-budget", defaultMemoryBudget, "memory Go's collector lets the server reach before it collects, while its live heap is small (a larger one is collected at Go's default pace, GOGC=100), e.g. 512MiB; 0: Go's default collector; GOGC or GOMEMLIMIT in the environment win (env BCD_MEMORY_BUDGET)")
	flagconfig.AddConfigFlag(f, serverSpec())
	return cmd
}

// serverSpec maps bcd server's flags to the environment: BCD_ and the flag's name (--history-retention:
// BCD_HISTORY_RETENTION), as docs/operations.md lists them. --store's value (a DSN may hold a
// password) is never repeated in an error.
func serverSpec() flagconfig.Spec {
	return flagconfig.Spec{EnvPrefix: "BCD_", Secret: []string{"store"}}
}

// configure fills cmd's own flags the command line did not set from the environment, then from
// the config file (flagconfig.Apply); a value refused there is a usage error.
func configure(g *globals, cmd *cobra.Command, s flagconfig.Spec) error {
	return usage(flagconfig.Apply(cmd.LocalFlags(), s, flagconfig.Source{Getenv: g.env.Getenv, ReadFile: os.ReadFile}))
}
