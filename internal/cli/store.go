package cli

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"bcd/internal/server"
)

// storeCmd is `bcd store`: what is done to the store itself, with no server running on it.
func storeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "store", Short: "The control plane's store, with every server stopped"}
	var cfg server.Config
	var reason string
	after := &cobra.Command{
		Use:   "after-restore [--data-dir DIR] [--store DSN] [--reason WHY]",
		Short: "Fence a store restored from a backup before starting servers on it: queued commands lost (never sent twice), unused join tokens void",
		Long: `A restored store forgets what happened after the backup; the agents did not. A command
still queued in it may have been taken and run by an agent after the backup, and would be sent
again to another agent. after-restore records every queued (or held) command lost (its step decides: a
query, a retry or a failure), voids every unused one-time join token, and lets the servers start
on the store (each refuses a store behind what it last recorded in it).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			storeFromEnv(g, cmd, &cfg)
			f, err := server.FenceRestore(cmd.Context(), cfg, reason)
			if err != nil {
				return err
			}
			out := g.env.Stdout
			fmt.Fprintln(out, "store fenced:")
			fmt.Fprintf(out, "  %d queued or held commands recorded lost (never sent), on %d nodes: their steps decide when the servers start\n", f.Commands, len(f.Nodes))
			fmt.Fprintf(out, "  %d unused one-time join tokens void (mint new ones for site agents not yet joined; agents that joined keep their certificates)\n", f.Tokens)
			fmt.Fprintln(out, "start the servers, then check `bcd doctor` and `bcd events`")
			return nil
		},
	}
	f := after.Flags()
	storeFlags(g, f, &cfg)
	f.StringVar(&reason, "reason", "", "why (recorded in the control_plane.restore_fenced event)")
	cmd.AddCommand(after)
	return cmd
}

// storeFlags are the flags of a command run on the store with every server stopped: where the
// store is, as bcd server finds it (with storeFromEnv).
func storeFlags(g *globals, f *pflag.FlagSet, cfg *server.Config) {
	f.StringVar(&cfg.DataDir, "data-dir", g.envOr("BCD_DATA_DIR", "data"), "the server's data directory (env BCD_DATA_DIR)")
	// The environment is read after parsing, not shown as the flag's default: help must not print
	// the password a DSN may hold.
	f.StringVar(&cfg.StoreDSN, "store", "", "store DSN: sqlite:PATH or postgres://… (default: env BCD_STORE, else sqlite:DATA-DIR/bcd.db)")
}

// storeFromEnv takes BCD_STORE when --store was not given: read after parsing, not shown as the
// flag's default.
func storeFromEnv(g *globals, cmd *cobra.Command, cfg *server.Config) {
	if !cmd.Flags().Changed("store") {
		cfg.StoreDSN = g.envOr("BCD_STORE", "")
	}
}
