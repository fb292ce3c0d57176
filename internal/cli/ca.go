package cli

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"bcd/internal/gen/bcdv1"
)

// caCmd is `bcd ca`: the installation's agent CA and its rotation (installation admins).
func caCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "ca", Short: "The agent CA and its rotation: status, rotate, activate, finish"}
	status := &cobra.Command{Use: "status", Short: "Show the agent CA, a rotation in progress and the agents holding it back", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.caCall(cmd.Context(), func(ctx context.Context, cl *clients) (*connect.Response[bcdv1.AgentCAResponse], error) {
				return cl.inventory.GetAgentCA(ctx, connect.NewRequest(&bcdv1.GetAgentCARequest{}))
			})
		}}
	var reason string
	var force bool
	rotate := &cobra.Command{Use: "rotate", Short: "Stage a new agent CA: trusted and handed out to agents, signing nothing until bcd ca activate", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.caCall(cmd.Context(), func(ctx context.Context, cl *clients) (*connect.Response[bcdv1.AgentCAResponse], error) {
				return cl.inventory.RotateAgentCA(ctx, connect.NewRequest(&bcdv1.RotateAgentCARequest{Reason: reason}))
			})
		}}
	activate := &cobra.Command{Use: "activate", Short: "Make the staged CA sign agents' and servers' certificates (refused while connected agents do not trust it)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.caCall(cmd.Context(), func(ctx context.Context, cl *clients) (*connect.Response[bcdv1.AgentCAResponse], error) {
				return cl.inventory.ActivateAgentCA(ctx, connect.NewRequest(&bcdv1.ActivateAgentCARequest{Reason: reason, Force: force}))
			})
		}}
	finish := &cobra.Command{Use: "finish", Short: "Stop trusting the previous CA (refused while agents are connected with its certificates)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.caCall(cmd.Context(), func(ctx context.Context, cl *clients) (*connect.Response[bcdv1.AgentCAResponse], error) {
				return cl.inventory.FinishAgentCA(ctx, connect.NewRequest(&bcdv1.FinishAgentCARequest{Reason: reason, Force: force}))
			})
		}}
	for _, c := range []*cobra.Command{rotate, activate, finish} {
		c.Flags().StringVar(&reason, "reason", "", "why (recorded in the control_plane.ca_* event)")
	}
	for _, c := range []*cobra.Command{activate, finish} {
		c.Flags().BoolVar(&force, "force", false, "go ahead although connected agents hold it back (they lose their connection and must join again)")
	}
	cmd.AddCommand(status, rotate, activate, finish)
	return cmd
}

func (g *globals) caCall(ctx context.Context, call func(context.Context, *clients) (*connect.Response[bcdv1.AgentCAResponse], error)) error {
	cl, err := g.clients()
	if err != nil {
		return err
	}
	resp, err := call(ctx, cl)
	if err != nil {
		return err
	}
	if g.output == "json" {
		return g.printJSON(resp.Msg)
	}
	printCARotation(g.env.Stdout, resp.Msg.Rotation)
	return nil
}

// printCARotation shows a rotation: its stage, its CAs and the agents holding it back.
func printCARotation(out io.Writer, r *bcdv1.AgentCARotation) {
	fmt.Fprintf(out, "agent CA rotation: %s\n", r.GetStage())
	for _, c := range []struct {
		role string
		ca   *bcdv1.AgentCA
	}{{"active", r.GetActive()}, {"next", r.GetNext()}, {"previous", r.GetPrevious()}} {
		if c.ca != nil {
			fmt.Fprintf(out, "  %-8s  %s  sha256:%s  until %s\n", c.role, c.ca.Subject, c.ca.Sha256, c.ca.NotAfter)
		}
	}
	switch r.GetStage() {
	case "staged":
		fmt.Fprintf(out, "connected agents that do not trust the next CA yet: %d (bcd ca activate waits for them)\n", len(r.GetLagging()))
	case "overlap":
		fmt.Fprintf(out, "connected agents with certificates of the previous CA: %d (bcd ca finish waits for them)\n", len(r.GetLagging()))
		fmt.Fprintln(out, "agents away since before bcd ca rotate still reconnect and fetch the new CA until bcd ca finish; after it they must join again")
	}
	for _, l := range r.GetLagging() {
		where := l.Site
		if l.Node != "" {
			where = l.Node
		}
		fmt.Fprintf(out, "  %s\t%s %s\t%s\n", l.Agent, l.Kind, where, l.Reason)
	}
}
