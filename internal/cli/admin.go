package cli

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"bcd/internal/gen/bcdv1"
	"bcd/internal/site/sitecmd"
)

func kv(m map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return dash(strings.Join(out, ","))
}

// done says that a call which answers nothing worked: text, or msg as JSON (an empty object),
// so that a script reading -o json always has something to parse.
func (g *globals) done(msg proto.Message, text string) error {
	if g.output == "json" {
		return g.printJSON(msg)
	}
	_, err := fmt.Fprintln(g.env.Stdout, text)
	return err
}

// table prints rows under a header, or msg as JSON.
func (g *globals) table(msg proto.Message, header string, rows [][]string) error {
	if g.output == "json" {
		return g.printJSON(msg)
	}
	tw := tabwriter.NewWriter(g.env.Stdout, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func siteCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "site", Short: "Sites: where site agents and machines are"}
	var create bcdv1.CreateSiteRequest
	var labels []string
	c := &cobra.Command{Use: "create NAME", Short: "Create a site", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			create.Name = args[0]
			var err error
			if create.Labels, err = labelMap(labels); err != nil {
				return err
			}
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.CreateSite(cmd.Context(), connect.NewRequest(&create))
			if err != nil {
				return err
			}
			s := resp.Msg.Site
			return g.table(resp.Msg, "NAME\tTENANT\tLABELS\tID", [][]string{{s.Name, s.Tenant, kv(s.Labels), s.Id}})
		}}
	c.Flags().StringVar(&create.Tenant, "tenant", "", "tenant (default: your token's, or default)")
	c.Flags().StringArrayVar(&labels, "label", nil, "label applied to every node that joins (key=value, repeatable)")
	var tenant string
	l := &cobra.Command{Use: "list", Short: "List sites", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.ListSites(cmd.Context(), connect.NewRequest(&bcdv1.ListSitesRequest{Tenant: tenant}))
			if err != nil {
				return err
			}
			var rows [][]string
			for _, s := range resp.Msg.Sites {
				rows = append(rows, []string{s.Name, s.Tenant, kv(s.Labels), s.Id})
			}
			return g.table(resp.Msg, "NAME\tTENANT\tLABELS\tID", rows)
		}}
	l.Flags().StringVar(&tenant, "tenant", "", "only this tenant's sites")
	d := &cobra.Command{Use: "delete SITE", Short: "Delete a site without pools", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.DeleteSite(cmd.Context(), connect.NewRequest(&bcdv1.DeleteSiteRequest{Site: args[0]}))
			if err != nil {
				return err
			}
			return g.done(resp.Msg, "deleted site "+args[0])
		}}
	cmd.AddCommand(c, l, d, siteJoinTokenCmd(g), siteRevokeAgentCmd(g), sitecmd.Command())
	return cmd
}

func poolRows(pools ...*bcdv1.Pool) [][]string {
	var rows [][]string
	for _, p := range pools {
		rows = append(rows, []string{p.Name, p.Site, p.Tenant, p.Policy.GetHardwareProfile(), yesNo(p.Policy.GetTrustProvisioningNetwork()), kv(p.Policy.GetLabels()),
			dash(strings.Join(p.Policy.GetHardwareRequirements(), " ")), p.Id})
	}
	return rows
}

const poolHeader = "NAME\tSITE\tTENANT\tHARDWARE PROFILE\tTRUST PXE NET\tLABELS\tREQUIRES\tID"

func poolCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "pool", Short: "Pools: machines of one site sharing a policy"}
	policyFlags := func(c *cobra.Command, pol *bcdv1.PoolPolicy, labels, baseline, bios, images *[]string) {
		c.Flags().StringVar(&pol.HardwareProfile, "hardware-profile", "redfish", "hardware profile (driver per concern)")
		c.Flags().BoolVar(&pol.TrustProvisioningNetwork, "trust-provisioning-network", false, "bind PXE-discovered MACs without operator confirmation")
		c.Flags().BoolVar(&pol.AutoAccept, "auto-accept", false, "accept machines a discovery-mode ramdisk reports at the pool's site without an operator (acceptance flow)")
		c.Flags().BoolVar(&pol.AutoAcceptInband, "auto-accept-inband", false, "with --auto-accept: also enroll what is accepted, its BMC credential provisioned in-band over the host's IPMI interface (as node accept --inband)")
		c.Flags().StringVar(&pol.FastTrackWindow, "fast-track-window", "", "how long the ramdisk stays up after commissioning, release or inspection for a deploy to use it without a boot (e.g. 10m; 0s: off; empty: the server's default)")
		c.Flags().StringArrayVar(labels, "label", nil, "label applied to every node that joins (key=value, repeatable)")
		c.Flags().StringArrayVar(baseline, "firmware-baseline", nil, "component=version the pool's machines must run, as their BMC names it (BIOS, BMC, NIC.Slot.1-1-1); checked at commissioning and release, a difference fails the node with FIRMWARE_DRIFT (repeatable)")
		c.Flags().StringArrayVar(bios, "bios-setting", nil, "attribute=value the pool's machines' BIOS must have, as their Redfish BMC names it (ProcVirtualization=Enabled); written at commissioning and release, applied by the ramdisk's boot and read back, a difference fails the node with BIOS_DRIFT (repeatable; no passwords; redfish profiles only)")
		c.Flags().StringArrayVar(&pol.HardwareRequirements, "require", nil, "hardware requirement KEY OP VALUE the pool's machines must meet, as 'memory>=256GiB' (quoted: > and < are the shell's; keys as bcd bulk --require); checked at every inspection, a machine that does not fails with HARDWARE_MISMATCH (repeatable)")
		c.Flags().StringArrayVar(images, "firmware-image", nil, "component=image: the catalog firmware image (bcd image add --format firmware) that brings a --firmware-baseline component to its version; at commissioning and release the BMC installs it where the component runs another version, before the ramdisk boots, and the baseline is checked after that boot (repeatable; redfish profiles only)")
	}
	var create bcdv1.CreatePoolRequest
	create.Policy = &bcdv1.PoolPolicy{}
	var cLabels, cBaseline, cBIOS, cImages []string
	c := &cobra.Command{Use: "create NAME --site SITE", Short: "Create a pool", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			create.Name = args[0]
			var err error
			if create.Policy.Labels, err = labelMap(cLabels); err != nil {
				return err
			}
			if create.Policy.FirmwareBaseline, err = pairMap("--firmware-baseline", "component=version", cBaseline); err != nil {
				return err
			}
			if create.Policy.BiosSettings, err = pairMap("--bios-setting", "attribute=value", cBIOS); err != nil {
				return err
			}
			if create.Policy.FirmwareImages, err = pairMap("--firmware-image", "component=image", cImages); err != nil {
				return err
			}
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.CreatePool(cmd.Context(), connect.NewRequest(&create))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, poolHeader, poolRows(resp.Msg.Pool))
		}}
	c.Flags().StringVar(&create.Site, "site", "default", "site of the pool")
	policyFlags(c, create.Policy, &cLabels, &cBaseline, &cBIOS, &cImages)
	var update bcdv1.UpdatePoolRequest
	update.Policy = &bcdv1.PoolPolicy{}
	var uLabels, uBaseline, uBIOS, uImages []string
	u := &cobra.Command{Use: "update POOL", Short: "Replace a pool's policy", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			update.Pool = args[0]
			var err error
			if update.Policy.Labels, err = labelMap(uLabels); err != nil {
				return err
			}
			if update.Policy.FirmwareBaseline, err = pairMap("--firmware-baseline", "component=version", uBaseline); err != nil {
				return err
			}
			if update.Policy.BiosSettings, err = pairMap("--bios-setting", "attribute=value", uBIOS); err != nil {
				return err
			}
			if update.Policy.FirmwareImages, err = pairMap("--firmware-image", "component=image", uImages); err != nil {
				return err
			}
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.UpdatePool(cmd.Context(), connect.NewRequest(&update))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, poolHeader, poolRows(resp.Msg.Pool))
		}}
	policyFlags(u, update.Policy, &uLabels, &uBaseline, &uBIOS, &uImages)
	var list bcdv1.ListPoolsRequest
	l := &cobra.Command{Use: "list", Short: "List pools", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.ListPools(cmd.Context(), connect.NewRequest(&list))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, poolHeader, poolRows(resp.Msg.Pools...))
		}}
	l.Flags().StringVar(&list.Site, "site", "", "only this site's pools")
	l.Flags().StringVar(&list.Tenant, "tenant", "", "only this tenant's pools")
	d := &cobra.Command{Use: "delete POOL", Short: "Delete a pool without nodes", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.DeletePool(cmd.Context(), connect.NewRequest(&bcdv1.DeletePoolRequest{Pool: args[0]}))
			if err != nil {
				return err
			}
			return g.done(resp.Msg, "deleted pool "+args[0])
		}}
	cmd.AddCommand(c, u, l, d)
	return cmd
}

func tenantCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "tenant", Short: "Tenants"}
	cmd.AddCommand(&cobra.Command{Use: "create NAME", Short: "Create a tenant", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.CreateTenant(cmd.Context(), connect.NewRequest(&bcdv1.CreateTenantRequest{Name: args[0]}))
			if err != nil {
				return err
			}
			t := resp.Msg.Tenant
			return g.table(resp.Msg, "NAME\tID", [][]string{{t.Name, t.Id}})
		}}, &cobra.Command{Use: "list", Short: "List tenants", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.ListTenants(cmd.Context(), connect.NewRequest(&bcdv1.ListTenantsRequest{}))
			if err != nil {
				return err
			}
			var rows [][]string
			for _, t := range resp.Msg.Tenants {
				rows = append(rows, []string{t.Name, t.Id})
			}
			return g.table(resp.Msg, "NAME\tID", rows)
		}})
	return cmd
}

func tokenRows(ts ...*bcdv1.Token) [][]string {
	var rows [][]string
	for _, t := range ts {
		rows = append(rows, []string{t.Name, t.Role, dash(t.Tenant), t.CreatedAt, dash(t.RevokedAt), t.Id})
	}
	return rows
}

const tokenHeader = "NAME\tROLE\tTENANT\tCREATED\tREVOKED\tID"

func tokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "API tokens (stored hashed; the secret is shown once)"}
	var create bcdv1.CreateTokenRequest
	c := &cobra.Command{Use: "create NAME --role ROLE", Short: "Create a token", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			create.Name = args[0]
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.tokens.Create(cmd.Context(), connect.NewRequest(&create))
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(resp.Msg)
			}
			fmt.Fprintf(g.env.Stdout, "token %s (%s) created; its secret, shown once:\n%s\n", resp.Msg.Token.Name, resp.Msg.Token.Role, resp.Msg.Secret)
			return nil
		}}
	c.Flags().StringVar(&create.Role, "role", "viewer", "admin, operator, approver or viewer")
	c.Flags().StringVar(&create.Tenant, "tenant", "", "tenant the token acts in (empty: every tenant; admins only)")
	l := &cobra.Command{Use: "list", Short: "List tokens", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.tokens.List(cmd.Context(), connect.NewRequest(&bcdv1.ListTokensRequest{}))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, tokenHeader, tokenRows(resp.Msg.Tokens...))
		}}
	r := &cobra.Command{Use: "revoke TOKEN", Short: "Revoke a token (by name or id)", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.tokens.Revoke(cmd.Context(), connect.NewRequest(&bcdv1.RevokeTokenRequest{Token: args[0]}))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, tokenHeader, tokenRows(resp.Msg.Token))
		}}
	w := &cobra.Command{Use: "whoami", Short: "Show the token in use", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.tokens.WhoAmI(cmd.Context(), connect.NewRequest(&bcdv1.WhoAmIRequest{}))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, tokenHeader, tokenRows(resp.Msg.Token))
		}}
	cmd.AddCommand(c, l, r, w)
	return cmd
}

func profileCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "hwprofile", Short: "Hardware profiles: the driver of each concern"}
	var drivers []string
	var hp bcdv1.HardwareProfile
	p := &cobra.Command{Use: "put NAME --driver concern=driver…", Short: "Create or replace a hardware profile", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			hp.Name = args[0]
			var err error
			if hp.Drivers, err = pairMap("--driver", "concern=driver, e.g. power=ipmi", drivers); err != nil {
				return err
			}
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.PutHardwareProfile(cmd.Context(), connect.NewRequest(&bcdv1.PutHardwareProfileRequest{Profile: &hp}))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, "NAME\tDRIVERS\tLOCAL BOOT", [][]string{{resp.Msg.Profile.Name, kv(resp.Msg.Profile.Drivers), resp.Msg.Profile.LocalBoot}})
		}}
	p.Flags().StringArrayVar(&drivers, "driver", nil, "concern=driver (power, management, boot, deploy, inspect, virtual-media, console)")
	p.Flags().StringVar(&hp.LocalBoot, "local-boot", "exit", "how iPXE boots the local disk: exit or sanboot")
	l := &cobra.Command{Use: "list", Short: "List hardware profiles", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.ListHardwareProfiles(cmd.Context(), connect.NewRequest(&bcdv1.ListHardwareProfilesRequest{}))
			if err != nil {
				return err
			}
			var rows [][]string
			for _, hp := range resp.Msg.Profiles {
				rows = append(rows, []string{hp.Name, kv(hp.Drivers), hp.LocalBoot})
			}
			return g.table(resp.Msg, "NAME\tDRIVERS\tLOCAL BOOT", rows)
		}}
	cmd.AddCommand(p, l)
	return cmd
}

func siteJoinTokenCmd(g *globals) *cobra.Command {
	var ttl time.Duration
	cmd := &cobra.Command{Use: "join-token SITE", Short: "Mint a one-time bootstrap token for a site agent (`bcd site run`)", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkJoinTokenTTL(ttl); err != nil {
				return err
			}
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.CreateSiteJoinToken(cmd.Context(), connect.NewRequest(&bcdv1.CreateSiteJoinTokenRequest{Site: args[0], TtlSeconds: int64(ttl / time.Second)}))
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(resp.Msg)
			}
			fmt.Fprintf(g.env.Stdout, "join token (one use, expires %s):\n%s\ngateway: %s\nCA certificate:\n%s", resp.Msg.ExpiresAt, resp.Msg.Token, resp.Msg.GatewayUrl, resp.Msg.CaPem)
			return nil
		}}
	cmd.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token stays valid (1m to 168h)")
	return cmd
}

// checkJoinTokenTTL refuses a --ttl the API refuses (ttl_seconds 60 to 604800), in the flag's terms.
func checkJoinTokenTTL(d time.Duration) error {
	if d < time.Minute || d > 7*24*time.Hour {
		return usagef("--ttl %s: accepted are 1m to 168h", shortDuration(d))
	}
	return nil
}

// shortDuration is d as an operator writes it: 200h, not 200h0m0s.
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func siteRevokeAgentCmd(g *globals) *cobra.Command {
	var reason string
	cmd := &cobra.Command{Use: "revoke-agent AGENT --reason WHY", Short: "Refuse a site agent's certificate from now on (a decommissioned host, a leaked key)", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.RevokeSiteAgent(cmd.Context(), connect.NewRequest(&bcdv1.RevokeSiteAgentRequest{Agent: args[0], Reason: reason}))
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(resp.Msg)
			}
			fmt.Fprintf(g.env.Stdout, "site agent %s of site %s revoked: its connects, calls and renewals are refused, its open stream ends within 30 s\n", resp.Msg.Agent, resp.Msg.Site)
			return nil
		}}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the site.agent.revoke event)")
	return cmd
}

func doctorCmd(g *globals) *cobra.Command {
	return &cobra.Command{Use: "doctor", Short: "Failed machines in maintenance, machines with no workflow, site agents, commands waiting for an agent, batches waiting for approval", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.nodes.Doctor(cmd.Context(), connect.NewRequest(&bcdv1.DoctorRequest{}))
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(resp.Msg)
			}
			out := g.env.Stdout
			if w := resp.Msg.RestoreWitness; w != nil && w.Command != "" {
				fmt.Fprintf(out, "NO COMMANDS ARE SENT: agent %s took command %s from this store at fence %d, and the store does not have it (since %s): it was restored from an older backup. Stop every server and run bcd store after-restore.\n",
					w.AgentId, w.Command, w.SeenFences, w.At)
			} else if w != nil {
				fmt.Fprintf(out, "NO COMMANDS ARE SENT: agent %s saw this store at fence %d, beat %d (since %s), newer than the store: it was restored from an older backup. Stop every server and run bcd store after-restore.\n",
					w.AgentId, w.SeenFences, w.SeenBeats, w.At)
			}
			fmt.Fprintf(out, "failed machines waiting in maintenance: %d\n", len(resp.Msg.Failed))
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			for _, f := range resp.Msg.Failed {
				fmt.Fprintf(tw, "  %s\t%s\tfrom %s\t%s\tsince %s\n", f.Name, f.FaultCode, f.FailedFrom, f.Message, f.Since)
			}
			tw.Flush()
			fmt.Fprintf(out, "machines in a workflow-driven state without a workflow: %d\n", len(resp.Msg.Stranded))
			for _, f := range resp.Msg.Stranded {
				fmt.Fprintf(tw, "  %s\t%s\tsince %s\n", f.Name, f.State, f.Since)
			}
			tw.Flush()
			if len(resp.Msg.HardwareShort) > 0 {
				fmt.Fprintf(out, "machines short of their pool's hardware requirements (their next inspection fails them): %d\n", len(resp.Msg.HardwareShort))
				for _, f := range resp.Msg.HardwareShort {
					fmt.Fprintf(tw, "  %s\t%s\t%s\n", f.Name, f.State, f.Message)
				}
				tw.Flush()
			}
			fmt.Fprintf(out, "servers: %d\n", len(resp.Msg.Servers))
			for _, s := range resp.Msg.Servers {
				fmt.Fprintf(tw, "  %s\tstarted %s\tlast alive %s\t%d agents\tclock offset %s\n", s.Id, s.StartedAt, s.LastSeen, s.Agents, dash(s.ClockOffset))
			}
			tw.Flush()
			fmt.Fprintf(out, "site agents: %d\n", len(resp.Msg.SiteAgents))
			for _, a := range resp.Msg.SiteAgents {
				cert := "certificate until " + dash(a.CertExpires)
				if a.RenewalOverdue {
					cert += " RENEWAL OVERDUE"
				}
				boot := "dhcp " + dash(a.Dhcp) + ", binding " + dash(a.BootBinding)
				if a.HoldsBootLease {
					boot += ", holds the boot lease"
				}
				if c := a.ArtifactCache; c != nil {
					boot += ", " + cacheSummary(c)
				}
				fmt.Fprintf(tw, "  %s\t%s\tconnected=%s\tlast seen %s\tserver %s\t%s\t%s\n", a.Id, a.Site, yesNo(a.Connected), a.LastSeen, dash(a.Server), cert, boot)
			}
			tw.Flush()
			fmt.Fprintf(out, "commands waiting for an agent: %d\n", queued(resp.Msg.Queues))
			for _, q := range resp.Msg.Queues {
				fmt.Fprintf(tw, "  %s\t%s\t%d\toldest queued %s\twaiting %s\n", q.Site, queueAgents(q.RunsOn), q.Commands, q.OldestQueuedAt, q.Waiting)
			}
			tw.Flush()
			for _, a := range resp.Msg.SiteAgents {
				if a.Connected && a.BootBinding == "none" {
					fmt.Fprintf(out, "  warning: %s (site %s) serves boot scripts, which carry one-time tokens, to any host that asks by MAC (boot binding none): run it with --dhcp proxy, full or observe\n", a.Id, a.Site)
				}
			}
			if r := resp.Msg.AgentCa; r != nil {
				printCARotation(out, r)
			}
			fmt.Fprintf(out, "batches waiting for approval: %d\n", len(resp.Msg.PendingBatches))
			for _, b := range resp.Msg.PendingBatches {
				fmt.Fprintf(tw, "  %s\t%s %s\t%d nodes\t%d/%d approvals\tby %s\twaiting %s\n", b.Id, b.Kind, b.Verb, b.Size, b.Approvals, b.Required, b.RequestedBy, b.Waiting)
			}
			return tw.Flush()
		}}
}

func deployProfileCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "profile", Short: "Operator-defined deploy profiles (bcd node deploy --profile NAME)"}
	put := &cobra.Command{Use: "put NAME --file PROFILE.json", Short: "Create or replace a deploy profile", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			file, _ := cmd.Flags().GetString("file")
			if file == "" {
				return usagef("--file PROFILE.json is required: the profile's JSON definition")
			}
			def, err := os.ReadFile(file)
			if err != nil {
				return fmt.Errorf("reading the profile: %w", err)
			}
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.PutDeployProfile(cmd.Context(), connect.NewRequest(&bcdv1.PutDeployProfileRequest{Profile: &bcdv1.DeployProfile{Name: args[0], Definition: string(def)}}))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, "NAME", [][]string{{resp.Msg.Profile.Name}})
		}}
	put.Flags().String("file", "", "JSON definition: {\"steps\":[{\"use\":…,\"args\":{…}}],\"cleanup\":[…]}")
	list := &cobra.Command{Use: "list", Short: "List operator-defined deploy profiles", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.ListDeployProfiles(cmd.Context(), connect.NewRequest(&bcdv1.ListDeployProfilesRequest{}))
			if err != nil {
				return err
			}
			var rows [][]string
			for _, p := range resp.Msg.Profiles {
				rows = append(rows, []string{p.Name, p.Definition})
			}
			return g.table(resp.Msg, "NAME\tDEFINITION", rows)
		}}
	del := &cobra.Command{Use: "delete NAME", Short: "Delete a deploy profile, or the override of a built-in metal-* profile (which then runs as built)", Args: useArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := cl.inventory.DeleteDeployProfile(cmd.Context(), connect.NewRequest(&bcdv1.DeleteDeployProfileRequest{Name: args[0]}))
			if err != nil {
				return err
			}
			return g.table(resp.Msg, "DELETED", [][]string{{args[0]}})
		}}
	cmd.AddCommand(put, list, del)
	return cmd
}

// queued sums the commands of doctor's queues. Pure.
func queued(qs []*bcdv1.DoctorQueue) int64 {
	n := int64(0)
	for _, q := range qs {
		n += q.Commands
	}
	return n
}

// queueAgents names the agents a doctor queue's commands wait for. Pure.
func queueAgents(runsOn string) string {
	switch runsOn {
	case "site":
		return "for the site agents"
	case "ramdisk":
		return "for the nodes' ramdisks"
	}
	return "for " + runsOn + " agents"
}

// cacheSummary is a site agent's artifact cache in one phrase: "cache 12.5 GiB of 20.0 GiB, 45
// artifacts, 3 evicted (4.0 GiB)".
func cacheSummary(c *bcdv1.DoctorArtifactCache) string {
	s := "cache " + gib(c.Bytes)
	if c.BoundBytes > 0 {
		s += " of " + gib(c.BoundBytes)
	}
	s += fmt.Sprintf(", %d artifacts", c.Artifacts)
	if c.Evictions > 0 {
		s += fmt.Sprintf(", %d evicted (%s)", c.Evictions, gib(c.EvictedBytes))
	}
	return s
}

func gib(b int64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }
