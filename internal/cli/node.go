package cli

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"bcd/internal/bmc"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/hardware"
	"bcd/internal/metal"
)

func nodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Enroll, inspect and drive machines"}
	cmd.AddCommand(discoveryCmds(g)...)
	cmd.AddCommand(discoveredCmd(g), enrollCmd(g), nodeUpdateCmd(g), nodeListCmd(g), nodeGetCmd(g), nodeEventsCmd(g), nodeAttestationsCmd(g), nodeCommandsCmd(g), nodeInventoryCmd(g), deleteCmd(g), powerCmd(g), consoleCmd(g), maintenanceCmd(g), deployCmd(g), undeployCmd(g), rotateCmd(g), bmcCredentialsCmd(g))
	for _, v := range []struct{ name, short string }{
		{"manage", "ready → manageable"},
		{"inspect", "manageable|ready → inspecting (in-band inventory), back where it came from"},
		{"provide", "manageable → commissioning → ready"},
		{"rescue", "deployed → rescue (boots the ramdisk)"},
		{"unrescue", "rescue → deployed (boots the installed OS)"},
		{"retire", "manageable|ready|deployed|failed → retiring (crypto-erase) → retired"},
		{"recover", "failed → where its workflow failed (a failed deploy is released first)"},
		{"abort", "stop the running workflow: failed, maintenance on"},
	} {
		cmd.AddCommand(simpleVerbCmd(g, v.name, v.short))
	}
	return cmd
}

// nodeVerb runs one node call and prints the node it answers with.
func (g *globals) nodeVerb(cmd *cobra.Command, call func(context.Context, *clients) (*connect.Response[bcdv1.NodeResponse], error)) error {
	return g.nodeVerbWait(cmd, waitFlags{}, call)
}

// labelMap reads --label key=value pairs.
func labelMap(pairs []string) (map[string]string, error) {
	return pairMap("--label", "key=value", pairs)
}

// pairMap reads the values of a repeatable flag of KEY=VALUE pairs; form is how the flag's help
// names them ("concern=driver").
func pairMap(flag, form string, pairs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nil, usagef("%s %q: use %s", flag, p, form)
		}
		out[k] = v
	}
	return out, nil
}

// exactArgs is cobra.ExactArgs with an error that says what the n arguments are.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return fmt.Errorf("%s takes %s; %d given", cmd.CommandPath(), what, len(args))
		}
		return nil
	}
}

// useArgs is exactArgs naming the n arguments as the command's Use line does ("get NODE":
// "bcd node get takes NODE; 0 given").
func useArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		return exactArgs(n, strings.Join(positionals(cmd.Use, n), " and "))(cmd, args)
	}
}

// positionals are the first n arguments a Use line names after the command's name: the words
// before the first flag or group ("deploy NODE --image IMAGE": NODE).
func positionals(use string, n int) []string {
	var out []string
	for _, w := range strings.Fields(use)[1:] {
		if len(out) == n || strings.HasPrefix(w, "-") || strings.HasPrefix(w, "(") || strings.HasPrefix(w, "[") {
			break
		}
		out = append(out, w)
	}
	return out
}

// maxArgs is cobra.MaximumNArgs with an error that says what the optional arguments are.
func maxArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) > n {
			return fmt.Errorf("%s takes at most %s; %d given", cmd.CommandPath(), what, len(args))
		}
		return nil
	}
}

func enrollCmd(g *globals) *cobra.Command {
	var in bcdv1.EnrollRequest
	in.Bmc = &bcdv1.BmcCredentials{}
	var labels []string
	var passwordFile, from string
	var parallel int
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "enroll NAME --bmc-address ADDR --bmc-username USER --bmc-password-file FILE",
		Short: "Enroll a machine by its BMC, or many from a file with --from (credentials are sealed at once)",
		Args:  enrollArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if from != "" {
				if w.wait {
					return usagef("--wait follows one node: with --from, follow them with bcd node list --label or bcd events --follow")
				}
				return g.enrollFromFile(cmd, from, parallel, &in, labels, passwordFile)
			}
			in.Name = args[0]
			var err error
			if in.Labels, err = labelMap(labels); err != nil {
				return err
			}
			if in.Bmc.Password, err = g.bmcPassword(passwordFile); err != nil {
				return err
			}
			return g.nodeVerbWait(cmd, w, func(ctx context.Context, c *clients) (*connect.Response[bcdv1.NodeResponse], error) {
				return c.nodes.Enroll(ctx, connect.NewRequest(&in))
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&in.Pool, "pool", "default", "pool to join (name or id)")
	bmcFlags(f, in.Bmc, &passwordFile)
	f.StringSliceVar(&in.Macs, "mac", nil, "provisioning NIC MAC (repeatable)")
	f.StringVar(&in.ProductUuid, "product-uuid", "", "SMBIOS product UUID")
	f.StringArrayVar(&labels, "label", nil, "label key=value (repeatable)")
	f.StringVar(&in.BootMode, "boot-mode", "", bootModeHelp)
	f.StringVar(&in.Reason, "reason", "", "why (recorded in the event log)")
	f.StringVar(&from, "from", "", "enroll every row of this CSV or JSON Lines file instead of NAME (columns: the flags' names; the flags fill empty cells)")
	f.IntVar(&parallel, "parallel", 8, "with --from: rows enrolled at once (1-64)")
	w.register(cmd)
	return cmd
}

const bootModeHelp = "firmware boot mode of the node: uefi or legacy (empty: the driver's behaviour)"

func nodeUpdateCmd(g *globals) *cobra.Command {
	var in bcdv1.UpdateNodeRequest
	var mode string
	cmd := &cobra.Command{
		Use:   "update NODE --boot-mode uefi|legacy|\"\"",
		Short: "Change a node's attributes (its boot mode), in any state",
		Long: `Change a node's attributes, in any state. --boot-mode sets the firmware mode of the node's
boot overrides (uefi or legacy; "" clears it: the driver's behaviour). Boot-device commands
built from now on carry it; a profile step that names a mode keeps its own.`,
		Args: exactArgs(1, "NODE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Node = args[0]
			if !cmd.Flags().Changed("boot-mode") {
				return usagef("nothing to update: give --boot-mode uefi, legacy or \"\"")
			}
			in.BootMode = &mode
			return g.nodeVerb(cmd, func(ctx context.Context, c *clients) (*connect.Response[bcdv1.NodeResponse], error) {
				return c.nodes.Update(ctx, connect.NewRequest(&in))
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&mode, "boot-mode", "", bootModeHelp)
	f.StringVar(&in.Reason, "reason", "", "why (recorded in the event log)")
	return cmd
}

// hardwareColumns are node list --hardware's columns of a node's facts (dashes for none). Pure.
func hardwareColumns(f *bcdv1.HardwareFacts) string {
	if f == nil {
		return "\t-\t-\t-\t-"
	}
	return fmt.Sprintf("\t%d\t%s\t%d (%s)\t%d", f.Threads, hardware.FormatBytes(f.MemoryBytes), f.Disks, hardware.FormatBytes(f.DiskBytes), f.Gpus)
}

func nodeListCmd(g *globals) *cobra.Command {
	var in bcdv1.ListNodesRequest
	var all bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List nodes (filters: --state --pool --site --maintenance --label --require)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.clients()
			if err != nil {
				return err
			}
			out := &bcdv1.ListNodesResponse{}
			for {
				resp, err := c.nodes.List(cmd.Context(), connect.NewRequest(&in))
				if err != nil {
					return err
				}
				out.Nodes = append(out.Nodes, resp.Msg.Nodes...)
				out.NextPageToken = resp.Msg.NextPageToken
				if !all || resp.Msg.NextPageToken == "" {
					break
				}
				in.PageToken = resp.Msg.NextPageToken
			}
			if g.output == "json" {
				return g.printJSON(out)
			}
			tw := tabwriter.NewWriter(g.env.Stdout, 2, 4, 2, ' ', 0)
			header, hwHeader := "NAME\tSTATE\tTARGET\tPOWER\tMAINT\tFAULT\tPOOL\tBMC", ""
			if in.Hardware {
				hwHeader = "\tTHREADS\tMEMORY\tDISKS\tGPUS"
			}
			fmt.Fprintln(tw, header+hwHeader+"\tID")
			for _, n := range out.Nodes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", n.Name, n.State, dash(n.TargetState), n.Power, yesNo(n.Maintenance), dash(n.FaultCode), n.Pool, n.Bmc.GetAddress())
				if in.Hardware {
					fmt.Fprint(tw, hardwareColumns(n.Hardware))
				}
				fmt.Fprintf(tw, "\t%s\n", n.Id)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if out.NextPageToken != "" {
				fmt.Fprintf(g.env.Stderr, "more nodes: --page-token %s (or --all)\n", out.NextPageToken)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&in.State, "state", "", "only nodes in this state")
	f.StringVar(&in.Pool, "pool", "", "only nodes of this pool")
	f.StringVar(&in.Site, "site", "", "only nodes of this site")
	f.StringVar(&in.Maintenance, "maintenance", "", "true or false")
	f.StringArrayVar(&in.Labels, "label", nil, "key=value (repeatable; all must match)")
	f.BoolVar(&in.Hardware, "hardware", false, "with each node's threads, memory, disks (count and total) and GPUs from its last inventory (- for a node never inspected)")
	f.StringArrayVar(&in.Require, "require", nil, "hardware requirement KEY OP VALUE, as 'gpus.nvidia>=2' (quoted: > and < are the shell's; repeatable; all must hold; keys as bcd bulk --require): only inspected nodes meeting them")
	f.StringVar(&in.Tenant, "tenant", "", "only nodes of this tenant")
	f.Int32Var(&in.PageSize, "page-size", 0, "nodes per page (default 500, max 10000)")
	f.StringVar(&in.PageToken, "page-token", "", "continue a listing")
	f.BoolVar(&all, "all", false, "follow every page")
	return cmd
}

// bootModeText shows a node's boot mode; empty is the driver's behaviour.
func bootModeText(m string) string {
	if m == "" {
		return "- (driver default)"
	}
	return m
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (g *globals) printNode(n *bcdv1.Node) error {
	if g.output == "json" {
		return g.printJSON(&bcdv1.NodeResponse{Node: n})
	}
	tw := tabwriter.NewWriter(g.env.Stdout, 2, 4, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("id", n.Id)
	row("name", n.Name)
	row("state", n.State)
	row("target", dash(n.TargetState))
	if n.FaultCode != "" {
		row("fault", fmt.Sprintf("%s (failed from %s) %s", n.FaultCode, n.FailedFrom, n.FaultMessage))
	}
	row("maintenance", yesNo(n.Maintenance)+" "+n.MaintenanceReason)
	if n.BatchId != "" {
		row("batch", n.BatchId+" (bcd batch show "+n.BatchId+")")
	}
	if len(n.Conditions) > 0 {
		var cs []string
		for _, k := range slices.Sorted(maps.Keys(n.Conditions)) {
			cs = append(cs, k+"="+n.Conditions[k])
		}
		row("conditions", strings.Join(cs, ", "))
	}
	row("power", n.Power)
	row("tenant/site/pool", n.Tenant+" / "+n.Site+" / "+n.Pool)
	row("hardware profile", n.HardwareProfile)
	row("bmc", fmt.Sprintf("%s %s (credentials %s, %s)", n.Bmc.GetDriver(), n.Bmc.GetAddress(), n.Bmc.GetUsernameRef(), n.Bmc.GetPasswordRef()))
	row("boot mode", bootModeText(n.BootMode))
	row("macs", dash(strings.Join(n.Macs, ", ")))
	var addrs []string
	for _, a := range n.Addresses {
		addrs = append(addrs, fmt.Sprintf("%s (%s, leased until %s)", a.Ip, a.Mac, a.ExpiresAt))
	}
	row("addresses", dash(strings.Join(addrs, ", ")))
	row("product uuid", dash(n.ProductUuid))
	var ls []string
	for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
		ls = append(ls, k+"="+n.Labels[k])
	}
	row("labels", dash(strings.Join(ls, ", ")))
	if n.DeployImage != "" {
		row("deploy", n.DeployProfile+" "+n.DeployImage)
	}
	if n.UserDataSha256 != "" {
		row("user-data", fmt.Sprintf("%d bytes, sha256 %s (sealed)", n.UserDataSize, n.UserDataSha256))
	}
	if a := n.Activity; a != nil {
		wf := fmt.Sprintf("%s (%s)", a.Workflow, a.WorkflowState)
		if a.Step < a.Steps {
			phase := "step"
			if a.Phase == "cleanup" {
				phase = "cleanup step"
			}
			wf += fmt.Sprintf(", %s %d/%d %s", phase, a.Step+1, a.Steps, a.StepName)
		}
		row("workflow", wf)
		if a.CommandKind != "" && a.Step < a.Steps {
			cmd := a.CommandKind + " " + a.CommandState
			if a.ProgressTotal > 0 {
				cmd += fmt.Sprintf(" %d%% (%d/%d)", 100*a.ProgressDone/a.ProgressTotal, a.ProgressDone, a.ProgressTotal)
			}
			if a.ProgressMessage != "" {
				cmd += " " + a.ProgressMessage
			}
			row("command", cmd)
		}
		if a.Error != "" {
			row("workflow error", a.Error)
		}
		switch {
		case a.RamdiskPoweringOff:
			row("ramdisk", "fast-track window over: told to power its host off")
		case a.RamdiskLingeringUntil != "":
			row("ramdisk", "lingering until "+a.RamdiskLingeringUntil+" (fast track: a workflow started before then needs no boot)")
		}
	}
	row("verbs accepted", dash(strings.Join(n.AllowedVerbs, ", ")))
	row("version", fmt.Sprint(n.Version))
	row("updated", n.UpdatedAt)
	return tw.Flush()
}

func nodeGetCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get NODE",
		Short: "Show one node (by id or name)",
		Args:  useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.nodeVerb(cmd, func(ctx context.Context, c *clients) (*connect.Response[bcdv1.NodeResponse], error) {
				return c.nodes.Get(ctx, connect.NewRequest(&bcdv1.GetNodeRequest{Node: args[0]}))
			})
		},
	}
}

// followLast is how many of the newest events bcd events --follow prints before what comes.
const followLast = 10

func nodeEventsCmd(g *globals) *cobra.Command {
	var in bcdv1.ListEventsRequest
	var follow bool
	var last int32
	cmd := &cobra.Command{
		Use:   "events [NODE]",
		Short: "Show the event log (of one node, or all)",
		Args:  maxArgs(1, "one NODE (none: the events of every node)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				in.Node = args[0]
			}
			pageLimit := in.Limit // (following after --last N, pages are --limit's again)
			if follow && cmd.Flags().Changed("after") {
				return usagef("--after with --follow: a follower starts at the newest events (--last N, default %d) and goes on from there; older events are listed without --follow (bcd events --after ID)", followLast)
			}
			if follow && !cmd.Flags().Changed("last") {
				last = followLast // as tail -f and journalctl -f: the newest few, then what comes
			}
			if follow || cmd.Flags().Changed("last") {
				if in.AfterId != 0 {
					return usagef("--last and --after: give one (--last N: the newest N events; --after ID: the events after ID)")
				}
				if last < 1 {
					return usagef("--last %d: give how many of the newest events, 1 or more", last)
				}
				in.Newest, in.Limit = true, last
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(g.env.Stdout, 2, 4, 2, ' ', 0)
			if g.output != "json" {
				fmt.Fprintln(tw, "ID\tAT\tNODE\tKIND\tFROM\tTO\tACTOR\tREASON\tDATA")
			}
			// Following reads in commit order from a cursor: by id, an event whose transaction
			// committed after one with a higher id would be passed over.
			in.Follow = follow
			for {
				resp, err := c.nodes.Events(cmd.Context(), connect.NewRequest(&in))
				if err != nil {
					if follow && cmd.Context().Err() != nil {
						return nil
					}
					return err
				}
				if g.output == "json" {
					if !follow {
						return g.printJSON(resp.Msg)
					}
					for _, e := range resp.Msg.Events { // one JSON object per line while following
						b, _ := protojson.Marshal(e)
						fmt.Fprintln(g.env.Stdout, string(b))
					}
				} else {
					for _, e := range resp.Msg.Events {
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Id, e.At, dash(e.Node), e.Kind, dash(e.FromState), dash(e.ToState), e.Actor, dash(e.Reason), e.Data)
					}
					if err := tw.Flush(); err != nil {
						return err
					}
				}
				if n := len(resp.Msg.Events); n > 0 {
					in.AfterId = resp.Msg.Events[n-1].Id
				}
				in.AfterCursor = resp.Msg.Cursor
				if !follow {
					return nil
				}
				if in.Newest { // the newest were the start: what follows comes after them, a page at a time
					in.Newest, in.Limit = false, pageLimit
				}
				if len(resp.Msg.Events) == 0 {
					select {
					case <-cmd.Context().Done():
						return nil
					case <-time.After(time.Second):
					}
				}
			}
		},
	}
	cmd.Flags().Uint64Var(&in.AfterId, "after", 0, "only events after this id")
	cmd.Flags().Int32Var(&in.Limit, "limit", 0, "at most this many per request (default 500)")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "print the newest events (--last, default 10), then keep printing new ones as they happen (until interrupted)")
	cmd.Flags().Int32Var(&last, "last", 0, "the newest N events (of the kinds asked for), oldest first; with --follow, then what comes")
	cmd.Flags().StringSliceVar(&in.Kinds, "kind", nil, "only events of this kind (node.fail), or of every kind under a prefix (node.*) (repeatable, or comma-separated; at most 16)")
	return cmd
}

func simpleVerbCmd(g *globals, verb, short string) *cobra.Command {
	var in bcdv1.NodeVerbRequest
	var w waitFlags
	cmd := &cobra.Command{
		Use:   verb + " NODE",
		Short: short,
		Args:  useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Node = args[0]
			calls := map[string]func(bcdv1connect.NodeServiceClient, context.Context, *connect.Request[bcdv1.NodeVerbRequest]) (*connect.Response[bcdv1.NodeResponse], error){
				"manage":   bcdv1connect.NodeServiceClient.Manage,
				"inspect":  bcdv1connect.NodeServiceClient.Inspect,
				"provide":  bcdv1connect.NodeServiceClient.Provide,
				"rescue":   bcdv1connect.NodeServiceClient.Rescue,
				"unrescue": bcdv1connect.NodeServiceClient.Unrescue,
				"retire":   bcdv1connect.NodeServiceClient.Retire,
				"recover":  bcdv1connect.NodeServiceClient.Recover,
				"abort":    bcdv1connect.NodeServiceClient.Abort,
			}
			return g.nodeVerbWait(cmd, w, func(ctx context.Context, c *clients) (*connect.Response[bcdv1.NodeResponse], error) {
				return calls[verb](c.nodes, ctx, connect.NewRequest(&in))
			})
		},
	}
	cmd.Flags().StringVar(&in.Reason, "reason", "", "why (recorded in the event log)")
	cmd.Flags().Uint64Var(&in.ExpectedVersion, "expected-version", 0, "apply only if the node is still at this version")
	if verb != "abort" { // abort ends the work: the node is failed at once
		w.register(cmd)
	}
	return cmd
}

func deployCmd(g *globals) *cobra.Command {
	var in bcdv1.DeployRequest
	var w waitFlags
	var userData string
	cmd := &cobra.Command{
		Use:   "deploy NODE --image IMAGE [--profile PROFILE] [--user-data FILE]",
		Short: "ready → deploying → deployed: write a catalog image and boot it",
		Args:  useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Node = args[0]
			if userData != "" {
				b, err := readUserData(cmd.InOrStdin(), userData)
				if err != nil {
					return usage(err)
				}
				in.UserData = b
			}
			return g.nodeVerbWait(cmd, w, func(ctx context.Context, c *clients) (*connect.Response[bcdv1.NodeResponse], error) {
				return c.nodes.Deploy(ctx, connect.NewRequest(&in))
			})
		},
	}
	cmd.Flags().StringVar(&in.Image, "image", "", "catalog image name or id")
	cmd.Flags().StringVar(&in.Profile, "profile", "default", "deploy profile")
	cmd.Flags().StringVar(&userData, "user-data", "", "operator user-data for the installed OS (cloud-init or Ignition, by the profile's guest; cloud-init where the profile writes a config drive; at most 64 KiB): a file, or - for standard input")
	cmd.Flags().StringVar(&in.Reason, "reason", "", "why (recorded in the event log)")
	cmd.Flags().Uint64Var(&in.ExpectedVersion, "expected-version", 0, "apply only if the node is still at this version")
	w.register(cmd)
	return cmd
}

// readUserData reads --user-data: the file path, or stdin for "-". Empty, unreadable or over
// the API's bound (metal.MaxUserData, checked here so that nothing is sent) is refused; the
// error never quotes the contents.
func readUserData(stdin io.Reader, path string) ([]byte, error) {
	var r io.Reader
	name := path
	if path == "-" {
		r, name = stdin, "standard input"
	} else {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("--user-data: %w", err)
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, metal.MaxUserData+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("--user-data: reading %s: %w", name, err)
	case len(b) > metal.MaxUserData:
		return nil, fmt.Errorf("--user-data: %s is larger than 64 KiB (%d bytes), the most a deploy takes", name, metal.MaxUserData)
	case len(b) == 0:
		return nil, fmt.Errorf("--user-data: %s is empty: give cloud-init user-data (#cloud-config …) or an Ignition config", name)
	}
	return b, nil
}

func undeployCmd(g *globals) *cobra.Command {
	var in bcdv1.UndeployRequest
	var w waitFlags
	cmd := &cobra.Command{
		Use:   "undeploy NODE [--wipe quick|full|secure]",
		Short: "deployed|rescue → releasing (attested wipe) → ready",
		Args:  useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Node = args[0]
			return g.nodeVerbWait(cmd, w, func(ctx context.Context, c *clients) (*connect.Response[bcdv1.NodeResponse], error) {
				return c.nodes.Undeploy(ctx, connect.NewRequest(&in))
			})
		},
	}
	cmd.Flags().StringVar(&in.Wipe, "wipe", "quick", "wipe mode: quick, full or secure")
	cmd.Flags().StringVar(&in.Reason, "reason", "", "why (recorded in the event log)")
	cmd.Flags().Uint64Var(&in.ExpectedVersion, "expected-version", 0, "apply only if the node is still at this version")
	w.register(cmd)
	return cmd
}

func powerCmd(g *globals) *cobra.Command {
	var in bcdv1.PowerRequest
	cmd := &cobra.Command{
		Use:   "power NODE on|off|soft|cycle|reset",
		Short: "Send a power action through the node's BMC (resting states only)",
		Args:  exactArgs(2, "NODE and a power action: "+powerActions()),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Node, in.Action = args[0], args[1]
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.nodes.Power(cmd.Context(), connect.NewRequest(&in))
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(resp.Msg)
			}
			fmt.Fprintf(g.env.Stdout, "queued bmc.power %s for %s: command %s\n", in.Action, resp.Msg.Node.Name, resp.Msg.CommandId)
			return nil
		},
	}
	cmd.Flags().StringVar(&in.Reason, "reason", "", "why (recorded in the event log)")
	return cmd
}

// powerActions lists the actions bcd node power accepts: "on, off, soft, cycle or reset".
func powerActions() string {
	var as []string
	for _, a := range bmc.PowerActions {
		as = append(as, string(a))
	}
	return strings.Join(as[:len(as)-1], ", ") + " or " + as[len(as)-1]
}

func maintenanceCmd(g *globals) *cobra.Command {
	var in bcdv1.MaintenanceRequest
	cmd := &cobra.Command{
		Use:   "maintenance NODE on|off",
		Short: "Set or clear the maintenance flag",
		Args:  exactArgs(2, "NODE and on or off"),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Node = args[0]
			switch args[1] {
			case "on":
				in.On = true
			case "off":
			default:
				return usagef("maintenance %q: accepted are on and off", args[1])
			}
			return g.nodeVerb(cmd, func(ctx context.Context, c *clients) (*connect.Response[bcdv1.NodeResponse], error) {
				return c.nodes.Maintenance(ctx, connect.NewRequest(&in))
			})
		},
	}
	cmd.Flags().StringVar(&in.Reason, "reason", "", "why (recorded in the event log)")
	return cmd
}

func deleteCmd(g *globals) *cobra.Command {
	var in bcdv1.DeleteNodeRequest
	cmd := &cobra.Command{
		Use:   "delete NODE",
		Short: "Forget a node (manageable, ready, retired, or failed without tenant data)",
		Args:  useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Node = args[0]
			c, err := g.clients()
			if err != nil {
				return err
			}
			if _, err := c.nodes.Delete(cmd.Context(), connect.NewRequest(&in)); err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(&bcdv1.DeleteNodeResponse{})
			}
			fmt.Fprintf(g.env.Stdout, "deleted %s\n", in.Node)
			return nil
		},
	}
	cmd.Flags().StringVar(&in.Reason, "reason", "", "why (recorded in the event log)")
	return cmd
}

func discoveredCmd(g *globals) *cobra.Command {
	var in bcdv1.ListDiscoveredRequest
	cmd := &cobra.Command{Use: "discovered --site SITE", Short: "Machines seen PXE-booting at a site with no boot entry (not enrolled)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.nodes.Discovered(cmd.Context(), connect.NewRequest(&in))
			if err != nil {
				return err
			}
			var rows [][]string
			for _, m := range resp.Msg.Machines {
				rows = append(rows, []string{m.Mac, dash(m.Uuid), dash(m.Arch), m.FirstSeen, m.LastSeen, m.Agent})
			}
			return g.table(resp.Msg, "MAC\tUUID\tARCH\tFIRST SEEN\tLAST SEEN\tAGENT", rows)
		}}
	cmd.Flags().StringVar(&in.Site, "site", "default", "site name or id")
	cmd.Flags().Int32Var(&in.Limit, "limit", 0, "at most this many (default 500)")
	return cmd
}
