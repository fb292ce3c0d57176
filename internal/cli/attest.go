package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"bcd/internal/engine"
	"bcd/internal/gen/bcdv1"
)

func nodeAttestationsCmd(g *globals) *cobra.Command {
	var in bcdv1.ListAttestationsRequest
	var save string
	cmd := &cobra.Command{
		Use:   "attestations NODE",
		Short: "Show a node's signed results (wipes, diagnostics), checked, and save them for an auditor",
		Long: `Lists the node's attested results, newest first: each was signed by the node's key in its
ramdisk, and the control plane checks the signature, the node's certificate and its identity
generation again now (VERIFIED). --save DIR writes what an auditor needs to check each one
without bcd: ca.pem, and per command ID.result.json (the bytes signed), ID.input (the signing
input, which ends with the SHA-256 of the result), ID.sig (ASN.1 ECDSA P-256 signature over
SHA-256 of the input) and ID.pem (the node's certificate). With openssl:

  openssl verify -CAfile ca.pem -attime EPOCH ID.pem
  openssl x509 -in ID.pem -pubkey -noout > ID.pub
  openssl dgst -sha256 -verify ID.pub -signature ID.sig ID.input
  sha256sum ID.result.json; tail -c 32 ID.input | xxd -p -c 32`,
		Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Node = args[0]
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.nodes.Attestations(cmd.Context(), connect.NewRequest(&in))
			if err != nil {
				return err
			}
			if save != "" {
				if err := saveAttestations(save, resp.Msg); err != nil {
					return err
				}
			}
			if g.output == "json" {
				return g.printJSON(resp.Msg)
			}
			tw := tabwriter.NewWriter(g.env.Stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "FINISHED\tKIND\tCOMMAND\tGENERATION\tVERIFIED\tRESULT")
			for _, a := range resp.Msg.Attestations {
				verified := "yes"
				if !a.Verified {
					verified = "NO: " + a.VerifyError
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", a.FinishedAt, a.Kind, a.CommandId, a.Generation, verified, resultSummary(a))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if save != "" {
				fmt.Fprintf(g.env.Stderr, "saved %d attestations and the agent CA in %s\n", len(resp.Msg.Attestations), save)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&in.Kind, "kind", "", "only this kind: disk.wipe or diag.dcgm")
	cmd.Flags().Int32Var(&in.Limit, "limit", 0, "at most this many (default 50, at most 1000)")
	cmd.Flags().StringVar(&save, "save", "", "write each attestation's files and the agent CA into this directory (created)")
	return cmd
}

// resultSummary says in a few words what a result holds: a wipe's disks and their read-back.
func resultSummary(a *bcdv1.Attestation) string {
	if a.Kind != "disk.wipe" {
		return fmt.Sprintf("%d bytes", len(a.Result))
	}
	var r engine.WipeResult
	if err := json.Unmarshal([]byte(a.Result), &r); err != nil {
		return "not JSON"
	}
	failed := 0
	for _, d := range r.Disks {
		if !d.Verified {
			failed++
		}
	}
	// Devices the wipe left alone (read-only media, multipath paths), named in the result.
	var sk struct {
		Skipped []struct{ Name string } `json:"skipped"`
	}
	_ = json.Unmarshal([]byte(a.Result), &sk)
	skipped := ""
	if n := len(sk.Skipped); n > 0 {
		skipped = fmt.Sprintf(" (%d devices skipped: --save shows why)", n)
	}
	if failed > 0 {
		return fmt.Sprintf("%d disks, %d did NOT read back%s", len(r.Disks), failed, skipped)
	}
	return fmt.Sprintf("%d disks, every one read back%s", len(r.Disks), skipped)
}

func saveAttestations(dir string, m *bcdv1.ListAttestationsResponse) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	write := func(name string, b []byte) error {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("saving %s: %w", name, err)
		}
		return nil
	}
	if err := write("ca.pem", []byte(m.CaPem)); err != nil {
		return err
	}
	for _, a := range m.Attestations {
		if a.CommandId == "" || a.CommandId != filepath.Base(a.CommandId) || a.CommandId == ".." {
			return fmt.Errorf("the server named a command %q: not a file name", a.CommandId)
		}
		for name, b := range map[string][]byte{".result.json": []byte(a.Result), ".input": a.SigningInput, ".sig": a.Signature, ".pem": []byte(a.SignerCertPem)} {
			if err := write(a.CommandId+name, b); err != nil {
				return err
			}
		}
	}
	return nil
}
