package cli

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"bcd/internal/gen/bcdv1"
	"bcd/internal/readable"
)

func nodeCommandsCmd(g *globals) *cobra.Command {
	var in bcdv1.ListCommandsRequest
	cmd := &cobra.Command{
		Use:   "commands NODE",
		Short: "Show the commands a node's workflows sent: to which agent, how long each waited and ran, how it ended",
		Long: `Lists the node's newest commands (--limit, default 50), oldest first: when each was
queued, its kind, the agent that took it, its state (lost: the agent went away holding it; it is
never sent twice), how long it waited for an agent (queued → acknowledged) and ran
(acknowledged → ended), the attempts (agents it was offered to), the workflow step that sent it
(profile#index; in the cleanup, the cleanup's index) and its error. --workflow narrows them to
one workflow (its id: bcd node get, bcd events). Arguments and results are not shown (bcd node
attestations shows the signed results).`,
		Args: exactArgs(1, "the NODE (name or id)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Node = args[0]
			c, err := g.clients()
			if err != nil {
				return err
			}
			resp, err := c.nodes.Commands(cmd.Context(), connect.NewRequest(&in))
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(resp.Msg)
			}
			return printCommands(g.env.Stdout, resp.Msg.Commands)
		},
	}
	cmd.Flags().StringVar(&in.Workflow, "workflow", "", "only this workflow's commands (its id)")
	cmd.Flags().Int32Var(&in.Limit, "limit", 0, "the newest this many (default 50, max 1000)")
	return cmd
}

// printCommands writes commands (newest first, as the API answers) oldest first, for a person.
func printCommands(w io.Writer, cmds []*bcdv1.CommandRecord) error {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUED\tKIND\tSTATE\tAGENT\tWAITED\tRAN\tTRIES\tSTEP\tERROR")
	for _, c := range slices.Backward(cmds) {
		step := "-" // an operator's power action, a rotation
		if c.Workflow != "" {
			step = fmt.Sprintf("%s#%d", cmp.Or(c.Profile, c.Workflow), c.Step)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", c.CreatedAt, c.Kind, c.State, dash(c.Agent),
			between(c.CreatedAt, c.DeliveredAt), between(c.DeliveredAt, c.FinishedAt), c.Attempts, step, dash(c.Error))
	}
	return tw.Flush()
}

// between is the time from one RFC 3339 instant to another, rounded for reading; "-" when
// either is missing (not yet, or never).
func between(from, to string) string {
	a, errA := time.Parse(time.RFC3339Nano, from)
	b, errB := time.Parse(time.RFC3339Nano, to)
	if from == "" || to == "" || errA != nil || errB != nil {
		return "-"
	}
	return readable.Duration(b.Sub(a))
}
