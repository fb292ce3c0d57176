package cli

import (
	"context"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	bcdv1 "bcd/internal/gen/bcdv1"
)

// discoveryCmds are the node subcommands of MAC binding and the acceptance flow.
func discoveryCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{confirmMacCmd(g), macCandidatesCmd(g), pendingCmd(g), acceptCmd(g), rejectCmd(g)}
}

func confirmMacCmd(g *globals) *cobra.Command {
	var in bcdv1.ConfirmMacRequest
	cmd := &cobra.Command{Use: "confirm-mac NODE MAC", Short: "Bind the candidate MAC a node enrolled by product UUID alone was seen PXE-booting with",
		Args: useArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Node, in.Mac = args[0], args[1]
			return g.nodeVerb(cmd, func(ctx context.Context, c *clients) (*connect.Response[bcdv1.NodeResponse], error) {
				return c.nodes.ConfirmMac(ctx, connect.NewRequest(&in))
			})
		}}
	cmd.Flags().StringVar(&in.Reason, "reason", "", "why (recorded in the event log)")
	return cmd
}

func macCandidatesCmd(g *globals) *cobra.Command {
	var in bcdv1.ListMacCandidatesRequest
	cmd := &cobra.Command{Use: "mac-candidates --site SITE", Short: "MAC candidates of nodes enrolled by product UUID alone (pending ones wait for confirm-mac)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.nodes.MacCandidates(cmd.Context(), connect.NewRequest(&in))
			if err != nil {
				return err
			}
			var rows [][]string
			for _, m := range resp.Msg.Candidates {
				rows = append(rows, []string{m.Node, m.Mac, m.Uuid, m.State, m.SeenAt, dash(m.DecidedBy)})
			}
			return g.table(resp.Msg, "NODE\tMAC\tUUID\tSTATE\tSEEN\tDECIDED BY", rows)
		}}
	cmd.Flags().StringVar(&in.Site, "site", "default", "site name or id")
	cmd.Flags().StringVar(&in.State, "state", "", "pending, confirmed, bound or expired (default all)")
	return cmd
}

func pendingCmd(g *globals) *cobra.Command {
	var in bcdv1.ListPendingRequest
	cmd := &cobra.Command{Use: "pending --site SITE", Short: "Machines a discovery-mode ramdisk reported at a site, waiting for accept or reject", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.nodes.Pending(cmd.Context(), connect.NewRequest(&in))
			if err != nil {
				return err
			}
			var rows [][]string
			for _, m := range resp.Msg.Machines {
				state := "pending"
				if m.Acceptance != "" {
					state = m.Acceptance
				}
				rows = append(rows, []string{m.Mac, dash(m.Uuid), state, m.LastSeen, m.Inventory})
			}
			return g.table(resp.Msg, "MAC\tUUID\tSTATE\tLAST SEEN\tINVENTORY (SELF-ASSERTED)", rows)
		}}
	cmd.Flags().StringVar(&in.Site, "site", "default", "site name or id")
	cmd.Flags().Int32Var(&in.Limit, "limit", 0, "at most this many (default 500)")
	return cmd
}

func acceptCmd(g *globals) *cobra.Command {
	var in bcdv1.AcceptRequest
	in.Bmc = &bcdv1.BmcCredentials{}
	var labels []string
	var passwordFile string
	cmd := &cobra.Command{
		Use:   "accept MAC --name NAME --pool POOL (--bmc-address ADDR --bmc-username USER --bmc-password-file FILE | --inband)",
		Short: "Enroll a discovered machine (by the MAC it PXE-booted with) with the operator's BMC credentials, or with one its ramdisk provisions in-band (--inband)",
		Args:  useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Mac = args[0]
			var err error
			if in.Labels, err = labelMap(labels); err != nil {
				return err
			}
			if err := acceptCredentials(in.Bmc, passwordFile, g.env.Getenv("BCD_BMC_PASSWORD") != ""); err != nil {
				return err
			}
			if !in.Bmc.Inband {
				if in.Bmc.Password, err = g.bmcPassword(passwordFile); err != nil {
					return err
				}
			}
			return g.nodeVerb(cmd, func(ctx context.Context, c *clients) (*connect.Response[bcdv1.NodeResponse], error) {
				return c.nodes.Accept(ctx, connect.NewRequest(&in))
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&in.Site, "site", "default", "site where the machine was seen (name or id)")
	f.StringVar(&in.Name, "name", "", "the node's name")
	f.StringVar(&in.Pool, "pool", "default", "pool to join (name or id), at that site")
	bmcFlags(f, in.Bmc, &passwordFile)
	f.BoolVar(&in.Bmc.Inband, "inband", false, "provision the BMC credential from the host over its IPMI interface (IPMI machines): the waiting ramdisk joins as the node, creates a BMC user (--bmc-username, default bcd) with a generated password and reports the BMC's address; the site agent then verifies it over the network")
	f.StringArrayVar(&labels, "label", nil, "label key=value (repeatable; the site's and pool's labels are added)")
	f.StringVar(&in.Reason, "reason", "", "why (recorded in the event log)")
	f.StringVar(&in.BootMode, "boot-mode", "", bootModeHelp)
	return cmd
}

// acceptCredentials checks, before anything is sent, that accept was given what binds the
// machine's BMC: --inband, or its address, user and password (a file or $BCD_BMC_PASSWORD). It
// never prompts: accept runs in scripts too.
func acceptCredentials(b *bcdv1.BmcCredentials, passwordFile string, envPassword bool) error {
	if b.Inband {
		if passwordFile != "" {
			return usagef("--inband generates the BMC password: drop --bmc-password-file")
		}
		return nil
	}
	var missing []string
	if b.Address == "" {
		missing = append(missing, "--bmc-address ADDR")
	}
	if b.Username == "" {
		missing = append(missing, "--bmc-username USER")
	}
	if passwordFile == "" && !envPassword {
		missing = append(missing, "--bmc-password-file FILE (or env BCD_BMC_PASSWORD)")
	}
	if len(missing) == 0 {
		return nil
	}
	return usagef("the machine's BMC credentials are missing: give %s, or --inband to have its ramdisk create a BMC user over the host's IPMI interface", strings.Join(missing, " "))
}

func rejectCmd(g *globals) *cobra.Command {
	var in bcdv1.RejectRequest
	cmd := &cobra.Command{Use: "reject MAC", Short: "Decline a discovered machine: it leaves the pending list and is not enrolled", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Mac = args[0]
			c, err := g.clients()
			if err != nil {
				return err
			}
			if _, err := c.nodes.Reject(cmd.Context(), connect.NewRequest(&in)); err != nil {
				return err
			}
			fmt.Fprintf(g.env.Stdout, "rejected %s\n", in.Mac)
			return nil
		}}
	cmd.Flags().StringVar(&in.Site, "site", "default", "site where the machine was seen (name or id)")
	cmd.Flags().StringVar(&in.Reason, "reason", "", "why (logged)")
	return cmd
}
