package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"bcd/internal/secrets"
	"bcd/internal/server"
	"bcd/internal/store"
)

// secretsCmd is `bcd secrets`: the sealing key of the stored secrets, with every server stopped.
func secretsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "secrets", Short: "The sealing key of the stored secrets (BMC credentials, the agent CA's keys), with every server stopped"}
	var cfg server.Config
	var batch int
	rotate := &cobra.Command{
		Use:   "rotate-key [--data-dir DIR] [--store DSN] [--seal-key-file FILE]",
		Short: "Replace the sealing key: add a new key to the key file, re-seal every secret under it, remove the old key (every server stopped; run again after a crash)",
		Long: `The sealing key (DATA-DIR/seal.key, or --seal-key-file) seals the BMC credentials and the
agent CA's keys in the store. rotate-key, with every server on the store stopped:
  1. checks that every sealed value opens with the key file as it is (else nothing changes);
  2. adds a new key to the key file (written whole, 0600): it seals from then on, the old
     one still opens;
  3. re-seals every secret and the agent CA's keys under the new key, in batches (one
     transaction each), and checks that every value opens under it;
  4. removes the old key from the key file.
A server started at any point opens every value. A run stopped half-way (a crash, an error)
leaves the key file holding both keys: run rotate-key again and it finishes the job with the
same new key. It refuses while a server runs on the store (SQLite: the store's lock;
PostgreSQL: a heartbeat within the last 30s) and when the key comes from BCD_SEAL_KEY. Then
give every server sharing the store the new key file.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			storeFromEnv(g, cmd, &cfg)
			if !cmd.Flags().Changed("seal-key-file") {
				cfg.KeyFile = g.envOr("BCD_SEAL_KEY_FILE", "")
			}
			if g.env.Getenv("BCD_SEAL_KEY") != "" {
				return errors.New("BCD_SEAL_KEY is set: servers given the key by the environment cannot have it replaced by rotate-key. Write the key to a file (0600), run rotate-key with --seal-key-file FILE and without BCD_SEAL_KEY, then give the servers the file's content as BCD_SEAL_KEY (or the file)")
			}
			return rotateKey(cmd.Context(), cfg.WithDefaults(), batch, g.env.Stdout)
		},
	}
	f := rotate.Flags()
	storeFlags(g, f, &cfg)
	f.StringVar(&cfg.KeyFile, "seal-key-file", "", "the sealing key file (default: env BCD_SEAL_KEY_FILE, else DATA-DIR/seal.key)")
	f.IntVar(&batch, "batch", secrets.DefaultBatch, "secrets re-sealed per transaction")
	cmd.AddCommand(rotate)
	return cmd
}

// rotateKey runs secrets.Rotate on the store of cfg, refusing while a server runs on it.
func rotateKey(ctx context.Context, cfg server.Config, batch int, out io.Writer) error {
	if batch <= 0 {
		return usagef("--batch %d: give a number of secrets per transaction, 1 or more (default %d)", batch, secrets.DefaultBatch)
	}
	st, err := server.OpenStopped(ctx, cfg, "give the server's --data-dir or --store")
	if err != nil {
		return err
	}
	defer st.Close()
	stopped := func(ctx context.Context) error {
		if st.PeerTimeout == 0 {
			return nil // SQLite: its lock shows it
		}
		var alive []string
		err := st.Write(ctx, func(tx *store.Tx) error {
			var err error
			alive, err = tx.ServersAliveSince(ctx, tx.At()-st.PeerTimeout.Microseconds())
			return err
		})
		if err != nil {
			return err
		}
		if len(alive) > 0 {
			return fmt.Errorf("server %s recorded that it was alive within the last %s: stop every server on the store first (a server that was killed counts as alive until %s after its last heartbeat)",
				strings.Join(alive, ", "), st.PeerTimeout, st.PeerTimeout)
		}
		return nil
	}
	if err := stopped(ctx); err != nil {
		return err
	}
	where := "the PostgreSQL store" // its DSN may hold a password
	if st.Engine == store.SQLite {
		where = "the SQLite store " + st.Target
	}
	fmt.Fprintf(out, "rotating the sealing key of %s (key file %s)\n", where, cfg.KeyFile)
	rot, err := secrets.Rotate(ctx, secrets.RotateConfig{KeyFile: cfg.KeyFile, Store: st.Store, Batch: batch, Stopped: stopped,
		Progress: func(p secrets.Progress) { fmt.Fprintln(out, "  "+describeRotation(p)) }})
	if err != nil {
		if rot.NewKey != "" {
			return fmt.Errorf("%w (the key file holds keys %s and %s: servers started now open every secret; run bcd secrets rotate-key again to finish)", err, rot.NewKey, strings.Join(rot.OldKeys, ", "))
		}
		return err
	}
	fmt.Fprintf(out, "done: %d secrets and %d agent CA keys re-sealed under key %s; %s holds it alone\n", rot.Resealed, rot.CAKeys, rot.NewKey, cfg.KeyFile)
	fmt.Fprintln(out, "give every server sharing the store this key file (or its content as BCD_SEAL_KEY) before starting it; backups of the store taken before now need the old key")
	return nil
}

// describeRotation is one line of a rotation's progress.
func describeRotation(p secrets.Progress) string {
	switch p.Step {
	case secrets.StepCheck:
		return fmt.Sprintf("checked %d/%d secrets: they open with the key file", p.Seen, p.Total)
	case secrets.StepAddKey:
		if p.Resumed {
			return fmt.Sprintf("finishing the rotation a run left unfinished: key %s seals; re-sealing what key %s sealed", p.NewKey, p.OldKeys)
		}
		return fmt.Sprintf("added key %s to the key file: it seals from now on; re-sealing what key %s sealed", p.NewKey, p.OldKeys)
	case secrets.StepReseal:
		return fmt.Sprintf("re-sealed %d secrets (%d/%d passed)", p.Resealed, p.Seen, p.Total)
	case secrets.StepVerify:
		return fmt.Sprintf("checked %d/%d secrets: they open under key %s", p.Seen, p.Total, p.NewKey)
	case secrets.StepTrimRing:
		return fmt.Sprintf("removed key %s from the key file", p.OldKeys)
	}
	return p.Step
}
