package cli

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"bcd/internal/batch"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/hardware"
	"bcd/internal/metal"
)

func bulkCmd(g *globals) *cobra.Command {
	var in bcdv1.BulkRequest
	var nodes, userData string
	var count int
	var wait bool
	var waitTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "bulk VERB --pool P (--nodes a,b,… | --selector key=value | deploy --count N [--spread LABEL]) [--require KEY>=VALUE] [deploy: --image IMG --profile P --user-data FILE] --reason WHY",
		Short: "Apply manage, inspect, provide, deploy, undeploy, rescue or retire to up to 10,000 nodes of one pool as one batch",
		Long: "Each node's move is decided as its own verb call; the accepted ones form one batch whose scope covers\n" +
			"every destructive command of the verb's chain of workflows. Where approvals are required the batch is\n" +
			"held until approvers approve it (bcd batch approve ID).\n" +
			"deploy --count N takes N of the pool's nodes that can deploy now (ready, out of maintenance, matching\n" +
			"the selectors if any; first by name), all or none; every node gets the image, profile and user-data.\n" +
			"With --spread LABEL (rack, row, power feed) the N are taken in turn from each of the label's values,\n" +
			"the nodes without it last: as evenly as the pool allows.\n" +
			"--require KEY OP VALUE (repeatable) narrows what --count or --selector choose to the nodes whose inventory\n" +
			"(reported when they were inspected) meets every requirement, as 'memory>=256GiB', 'gpus.nvidia>=2',\n" +
			"'disk.largest>=1.92TB', 'nic.mbps>=25000', boot=uefi, cpu.flag=avx512f (quote them: > and < are the shell's);\n" +
			"sizes take B, kB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB. Keys:\n" + hardware.KeyHelp(),
		Args: exactArgs(1, "the VERB: "+bulkVerbs()),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Verb = args[0]
			if nodes != "" {
				for _, n := range strings.Split(nodes, ",") {
					if n = strings.TrimSpace(n); n != "" {
						in.Nodes = append(in.Nodes, n)
					}
				}
			}
			if count < 0 || count > batch.MaxBulk {
				return usagef("--count %d: from 1 to %d nodes are taken in one bulk deploy", count, batch.MaxBulk)
			}
			in.Count = int32(count)
			if userData != "" {
				b, err := readUserData(cmd.InOrStdin(), userData)
				if err != nil {
					return usage(err)
				}
				in.UserData = b
			}
			switch {
			case in.Pool == "":
				return usagef("--pool P is required: the pool whose nodes the verb applies to")
			case count != 0 && len(in.Nodes) > 0:
				return usagef("--count takes nodes from the pool by itself: give --selector key=value or nothing, not --nodes")
			case count == 0 && (len(in.Nodes) == 0) == (len(in.Selectors) == 0):
				return usagef("give either --nodes a,b,… or --selector key=value (not both), or deploy --count N")
			case in.Spread != "" && count == 0:
				return usagef("--spread applies with deploy --count N only: it chooses which of the pool's nodes the count takes")
			case len(in.Require) > 0 && len(in.Nodes) > 0:
				return usagef("--require narrows what --count or --selector choose: give it with them, not with --nodes")
			}
			if _, err := hardware.ParseAll(in.Require); err != nil {
				return usage(err)
			}
			if strings.TrimSpace(in.Reason) == "" {
				return usagef("--reason WHY is required: approvers read it")
			}
			if wait && g.output == "json" {
				return usagef("--wait shows progress for a person: with -o json, run bcd batch wait ID -o json after this command (its answer names the batch)")
			}
			if wait && waitTimeout <= 0 {
				return usagef("--wait-timeout %s: give a duration above zero (e.g. 2h)", waitTimeout)
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.batches.Bulk(cmd.Context(), connect.NewRequest(&in))
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(resp.Msg)
			}
			m := resp.Msg
			accepted := 0
			tw := tabwriter.NewWriter(g.env.Stdout, 2, 4, 2, ' ', 0)
			for _, n := range m.Nodes {
				if n.Accepted {
					accepted++
					continue
				}
				fmt.Fprintf(tw, "refused\t%s\t%s\n", firstNonEmpty(n.Name, n.Node), n.Error)
			}
			tw.Flush()
			fmt.Fprintf(g.env.Stdout, "%d of %d nodes accepted\n", accepted, len(m.Nodes))
			if len(m.SpreadTaken) > 0 {
				fmt.Fprintln(g.env.Stdout, spreadLine(in.Spread, m.SpreadTaken))
			}
			if m.Batch.GetBatchId() == "" {
				return nil
			}
			if m.Batch.Held {
				fmt.Fprintf(g.env.Stdout, "batch %s: held until %d approvals (bcd batch approve %s)\n", m.Batch.BatchId, m.Batch.Required, m.Batch.BatchId)
			} else {
				fmt.Fprintf(g.env.Stdout, "batch %s: running (%d nodes)\n", m.Batch.BatchId, m.Batch.Size)
			}
			if !wait {
				return nil
			}
			return g.waitBatch(cmd.Context(), c, m.Batch.BatchId, waitTimeout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&in.Pool, "pool", "", "the pool (name or id)")
	f.StringVar(&nodes, "nodes", "", "comma-separated node names or ids")
	f.StringArrayVar(&in.Selectors, "selector", nil, "label selector key=value (repeatable; all must match)")
	f.StringVar(&in.Wipe, "wipe", "", "undeploy: quick (default), full or secure")
	f.StringVar(&in.Image, "image", "", "deploy: the catalog image (name or id)")
	f.StringVar(&in.Profile, "profile", "", "deploy: the deploy profile (default: default)")
	f.StringVar(&userData, "user-data", "", "deploy: operator user-data for every node's installed OS (as bcd node deploy --user-data; each node gets its own sealed copy): a file, or - for standard input")
	f.IntVar(&count, "count", 0, "deploy: take this many of the pool's nodes that can deploy now (matching --selector, if given), all or none")
	f.StringVar(&in.Spread, "spread", "", "deploy --count: a label key (rack, row, power feed); the count is taken in turn from each of its values, the nodes without it last")
	f.StringArrayVar(&in.Require, "require", nil, "hardware requirement KEY OP VALUE, as 'memory>=256GiB' (quoted: > and < are the shell's; repeatable; all must hold): only inspected nodes meeting them are chosen")
	f.StringVar(&in.Reason, "reason", "", "why (required; approvers read it)")
	f.BoolVar(&wait, "wait", false, "follow the batch until none of its nodes is at work (as bcd batch wait): its progress on stderr, then its failures; exit 7 if any")
	f.DurationVar(&waitTimeout, "wait-timeout", 6*time.Hour, "with --wait: stop waiting after this long (the batch's work goes on; exit 6)")
	return cmd
}

// spreadLine says how many nodes each value of label gave a spread bulk deploy: "spread over
// rack: r1 57, r2 57, r3 30, (none) 56", the values in order, those without the label last.
// Pure.
func spreadLine(label string, taken map[string]int32) string {
	values := slices.Sorted(maps.Keys(taken))
	if i := slices.Index(values, "(none)"); i >= 0 {
		values = append(slices.Delete(values, i, i+1), "(none)")
	}
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = fmt.Sprintf("%s %d", v, taken[v])
	}
	return "spread over " + label + ": " + strings.Join(parts, ", ")
}

// bulkVerbs lists the verbs bcd bulk applies: "manage, inspect, provide, deploy, undeploy, rescue or retire".
func bulkVerbs() string {
	var vs []string
	for _, v := range batch.BulkVerbs {
		vs = append(vs, string(v))
	}
	return strings.Join(vs[:len(vs)-1], ", ") + " or " + vs[len(vs)-1]
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

func batchRows(bs ...*bcdv1.Batch) [][]string {
	var rows [][]string
	for _, b := range bs {
		rows = append(rows, []string{b.Id, b.State, b.Kind, b.Verb, strconv.Itoa(int(b.Size)), fmt.Sprintf("%d/%d", b.Size-b.Parked, b.Size),
			fmt.Sprintf("%d/%d", len(b.Approvers), b.Required), b.RequestedBy, b.CreatedAt, b.Reason})
	}
	return rows
}

// batchHeader heads batchRows; AT REST is how many of the batch's nodes no longer work under it
// (bcd batch wait ID follows it, and names those that failed).
const batchHeader = "ID\tSTATE\tKIND\tVERB\tSIZE\tAT REST\tAPPROVALS\tREQUESTED BY\tCREATED\tREASON"

func batchCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "batch", Short: "Batches of destructive commands: list, show, approve, withdraw, reject; approvals policy"}
	var state string
	var limit int32
	list := &cobra.Command{Use: "list", Short: "List batches, newest first", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.batches.List(cmd.Context(), connect.NewRequest(&bcdv1.ListBatchesRequest{State: state, Limit: limit}))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, batchHeader, batchRows(resp.Msg.Batches...))
		}}
	list.Flags().StringVar(&state, "state", "", "pending, approved, running, rejected or cancelled")
	list.Flags().Int32Var(&limit, "limit", 0, "at most this many (default 100)")
	var leafLimit int32
	show := &cobra.Command{Use: "show ID", Short: "Show a batch, its approvers and its scope's leaves", Args: exactArgs(1, "the batch's ID (bcd batch list)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.batches.Get(cmd.Context(), connect.NewRequest(&bcdv1.GetBatchRequest{Id: args[0], LeafLimit: leafLimit}))
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(resp.Msg)
			}
			b := resp.Msg.Batch
			out := g.env.Stdout
			fmt.Fprintf(out, "batch %s (%s %s) %s\n  pool %s  site %s  size %d  parked on %d nodes\n  requested by %s at %s: %s\n  approvals %d/%d: %s\n",
				b.Id, b.Kind, b.Verb, b.State, b.Pool, b.Site, b.Size, b.Parked, b.RequestedBy, b.CreatedAt, b.Reason, len(b.Approvers), b.Required, strings.Join(b.Approvers, ", "))
			if b.DecidedBy != "" {
				fmt.Fprintf(out, "  decided by %s at %s %s\n", b.DecidedBy, b.DecidedAt, b.DecisionReason)
			}
			if b.Image != "" {
				fmt.Fprintf(out, "  writes image %s %s\n", b.Image, b.ImageDigest)
			}
			fmt.Fprintf(out, "  nodes at rest %d/%d: %d failed, %d aborted\n", b.Size-b.Parked, b.Size, resp.Msg.Failed, resp.Msg.Aborted)
			if err := printBatchFailures(out, resp.Msg); err != nil {
				return err
			}
			fmt.Fprintf(out, "  scope: %d leaves (showing %d)\n", b.Leaves, len(resp.Msg.Leaves))
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			for _, l := range resp.Msg.Leaves {
				fmt.Fprintf(tw, "    %s\t%s\n", l.Kind, l.Subject)
			}
			return tw.Flush()
		}}
	show.Flags().Int32Var(&leafLimit, "leaves", 0, "show at most this many leaves (default 1000)")
	decide := func(use, short string, call func(c *clients, cmd *cobra.Command, req *bcdv1.BatchDecisionRequest) (*connect.Response[bcdv1.BatchResponse], error)) *cobra.Command {
		var reason string
		d := &cobra.Command{Use: use + " ID", Short: short, Args: exactArgs(1, "the batch's ID (bcd batch list --state pending lists those waiting)"),
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := g.clients()
				if err != nil {
					return err
				}
				resp, err := call(c, cmd, &bcdv1.BatchDecisionRequest{Id: args[0], Reason: reason})
				if err != nil {
					return err
				}
				return g.table(resp.Msg, batchHeader, batchRows(resp.Msg.Batch))
			}}
		d.Flags().StringVar(&reason, "reason", "", "why (recorded in the event log)")
		return d
	}
	approve := decide("approve", "Approve a batch (not your own); at the quorum it runs", func(c *clients, cmd *cobra.Command, req *bcdv1.BatchDecisionRequest) (*connect.Response[bcdv1.BatchResponse], error) {
		return c.batches.Approve(cmd.Context(), connect.NewRequest(req))
	})
	withdraw := decide("withdraw", "Withdraw your approval of a batch that has not started", func(c *clients, cmd *cobra.Command, req *bcdv1.BatchDecisionRequest) (*connect.Response[bcdv1.BatchResponse], error) {
		return c.batches.Withdraw(cmd.Context(), connect.NewRequest(req))
	})
	reject := decide("reject", "Reject a batch that has not started: its nodes return where their verb found them", func(c *clients, cmd *cobra.Command, req *bcdv1.BatchDecisionRequest) (*connect.Response[bcdv1.BatchResponse], error) {
		return c.batches.Reject(cmd.Context(), connect.NewRequest(req))
	})
	cmd.AddCommand(list, show, batchWaitCmd(g), approve, withdraw, reject, approvalsCmd(g))
	return cmd
}

func approvalsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "approvals", Short: "How many approvals destructive commands need (installation, site, pool; the largest applies)"}
	var site, pool string
	set := &cobra.Command{Use: "set N (--installation | --site S | --pool P)", Short: "Require N approvals (0 removes the policy)", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := approvalsCount(args[0])
			if err != nil {
				return err
			}
			inst, _ := cmd.Flags().GetBool("installation")
			req := &bcdv1.SetApprovalPolicyRequest{Required: n}
			switch {
			case inst && site == "" && pool == "":
				req.Scope = "installation"
			case !inst && site != "" && pool == "":
				req.Scope, req.Ref = "site", site
			case !inst && site == "" && pool != "":
				req.Scope, req.Ref = "pool", pool
			default:
				return usagef("give exactly one of --installation, --site S, --pool P")
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.batches.SetApprovalPolicy(cmd.Context(), connect.NewRequest(req))
			if err != nil {
				return err
			}
			p := resp.Msg.Policy
			return g.table(resp.Msg, "SCOPE\tREQUIRED", [][]string{{p.Scope, strconv.Itoa(int(p.Required))}})
		}}
	set.Flags().Bool("installation", false, "the whole installation")
	set.Flags().StringVar(&site, "site", "", "a site (name or id)")
	set.Flags().StringVar(&pool, "pool", "", "a pool (name or id)")
	list := &cobra.Command{Use: "list", Short: "List approvals policies", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.batches.ListApprovalPolicies(cmd.Context(), connect.NewRequest(&bcdv1.ListApprovalPoliciesRequest{}))
			if err != nil {
				return err
			}
			var rows [][]string
			for _, p := range resp.Msg.Policies {
				rows = append(rows, []string{p.Scope, strconv.Itoa(int(p.Required)), p.UpdatedBy, p.UpdatedAt})
			}
			return g.table(resp.Msg, "SCOPE\tREQUIRED\tBY\tAT", rows)
		}}
	cmd.AddCommand(set, list)
	return cmd
}

// approvalsCount reads bcd batch approvals set's N. It is checked here, in full: a number the
// request's int32 cannot hold would reach the server wrapped (4294967296 as 0, removing the
// policy).
func approvalsCount(s string) (int32, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > metal.MaxRequiredApprovals {
		return 0, usagef("N %q: accepted are 0 to %d approvals (0 removes the policy)", s, metal.MaxRequiredApprovals)
	}
	return int32(n), nil
}

func rotateCmd(g *globals) *cobra.Command {
	var reason string
	cmd := &cobra.Command{Use: "rotate-bmc-credential NODE", Short: "Rotate the node's BMC password (two-phase: current only once a site agent verified it)", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.nodes.RotateBmcCredential(cmd.Context(), connect.NewRequest(&bcdv1.RotateBmcCredentialRequest{Node: args[0], Reason: reason}))
			if err != nil {
				return err
			}
			m := resp.Msg
			return g.table(m, "VERSION\tCOMMAND\tBATCH", [][]string{{strconv.FormatUint(m.Version, 10), m.CommandId, m.BatchId}})
		}}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the event log)")
	return cmd
}

func bmcCredentialsCmd(g *globals) *cobra.Command {
	return &cobra.Command{Use: "bmc-credentials NODE", Short: "List the node's BMC credential versions (references only)", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.nodes.BmcCredentialVersions(cmd.Context(), connect.NewRequest(&bcdv1.ListBmcCredentialVersionsRequest{Node: args[0]}))
			if err != nil {
				return err
			}
			var rows [][]string
			for _, v := range resp.Msg.Versions {
				rows = append(rows, []string{strconv.FormatUint(v.Version, 10), v.State, v.CommandId, v.CreatedAt, v.DecidedAt, v.Error})
			}
			return g.table(resp.Msg, "VERSION\tSTATE\tCOMMAND\tCREATED\tDECIDED\tERROR", rows)
		}}
}
