package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"bcd/internal/gen/bcdv1"
)

// batchPollInterval is how often a batch's wait reads it.
const batchPollInterval = 2 * time.Second

// batchFailedError is a batch followed to its end some of whose nodes failed or were aborted.
type batchFailedError struct {
	id              string
	failed, aborted int32
}

func (e *batchFailedError) Error() string {
	return fmt.Sprintf("batch %s: %d of its nodes failed and %d were aborted (listed above; a failed node is in maintenance: bcd node recover)", e.id, e.failed, e.aborted)
}

// batchDone reports whether a batch has no node at work left: every node it took rests (at its
// verb's end, failed, or returned by a rejection). Pure.
func batchDone(b *bcdv1.Batch) bool { return b.Parked == 0 }

// batchStatus is one line saying where a batch is: its state, how many of its nodes rest, how
// many failed, what it waits for. Pure.
func batchStatus(m *bcdv1.GetBatchResponse) string {
	b := m.Batch
	var s strings.Builder
	fmt.Fprintf(&s, "batch %s %s %s: %d/%d at rest", b.Id, b.Verb, b.State, b.Size-b.Parked, b.Size)
	if m.Failed > 0 {
		fmt.Fprintf(&s, ", %d failed", m.Failed)
	}
	if m.Aborted > 0 {
		fmt.Fprintf(&s, ", %d aborted", m.Aborted)
	}
	if b.State == "pending" {
		fmt.Fprintf(&s, " · waiting for approvals %d/%d (bcd batch approve %s)", len(b.Approvers), b.Required, b.Id)
	}
	return s.String()
}

// batchStatusKey is batchStatus with the nodes at rest in tenths of the batch: a log gets a line
// per tenth, not per node. Pure.
func batchStatusKey(m *bcdv1.GetBatchResponse) string {
	b := m.Batch
	tenth := int32(10)
	if b.Size > 0 {
		tenth = 10 * (b.Size - b.Parked) / b.Size
	}
	return fmt.Sprintf("%s %d %d %d %d/%d", b.State, tenth, m.Failed, m.Aborted, len(b.Approvers), b.Required)
}

// followBatch reads the batch every interval until no node of it is at work, showing its
// status, for at most timeout (followUntil).
func followBatch(ctx context.Context, get func(context.Context) (*bcdv1.GetBatchResponse, error), status *statusWriter, interval, timeout time.Duration) (*bcdv1.GetBatchResponse, error) {
	return followUntil(ctx, followed[*bcdv1.GetBatchResponse]{what: "batch", show: "bcd batch show", get: get,
		done: func(m *bcdv1.GetBatchResponse) bool {
			status.showLine(batchStatus(m), batchStatusKey(m))
			return batchDone(m.Batch)
		}, describe: batchStatus}, status, interval, timeout)
}

// printBatchEnd writes how a batch followed to its end ended: its nodes at rest, and each that
// failed or was aborted (at most as many as the answer names).
func printBatchEnd(w io.Writer, m *bcdv1.GetBatchResponse) error {
	b := m.Batch
	fmt.Fprintf(w, "batch %s %s %s: %d nodes at rest, %d failed, %d aborted\n", b.Id, b.Verb, b.State, b.Size-b.Parked, m.Failed, m.Aborted)
	return printBatchFailures(w, m)
}

// printBatchFailures lists a batch's nodes that failed or were aborted, as its answer names
// them (nothing when none did).
func printBatchFailures(w io.Writer, m *bcdv1.GetBatchResponse) error {
	if len(m.Failures) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tFAULT\tAT\tERROR")
	for _, f := range m.Failures {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", firstNonEmpty(f.Name, f.Node), f.State, dash(f.FaultCode), f.At, dash(f.Error))
	}
	if n := int(m.Failed + m.Aborted); n > len(m.Failures) {
		fmt.Fprintf(tw, "… and %d more\t\t\t\t\n", n-len(m.Failures))
	}
	return tw.Flush()
}

// waitBatch follows batch id to its end (followBatch) and prints how it ended; nodes that
// failed or were aborted end it with a *batchFailedError.
func (g *globals) waitBatch(ctx context.Context, c *clients, id string, timeout time.Duration) error {
	get := func(ctx context.Context) (*bcdv1.GetBatchResponse, error) {
		r, err := c.batches.Get(ctx, connect.NewRequest(&bcdv1.GetBatchRequest{Id: id, LeafLimit: 1}))
		if err != nil {
			return nil, err
		}
		return r.Msg, nil
	}
	status := &statusWriter{w: g.env.Stderr, terminal: isTerminal(g.env.Stderr)}
	m, err := followBatch(ctx, get, status, batchPollInterval, timeout)
	if err != nil {
		return err
	}
	if g.output == "json" {
		if err := g.printJSON(m); err != nil {
			return err
		}
	} else if err := printBatchEnd(g.env.Stdout, m); err != nil {
		return err
	}
	if m.Failed > 0 || m.Aborted > 0 {
		return &batchFailedError{id: id, failed: m.Failed, aborted: m.Aborted}
	}
	return nil
}

func batchWaitCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Follow a batch until none of its nodes is at work: its progress on stderr, then its failures; exit 7 if any",
		Args:  exactArgs(1, "the batch's ID (bcd batch list)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return usagef("--timeout %s: give a duration above zero (e.g. 2h)", timeout)
			}
			c, err := g.clients()
			if err != nil {
				return err
			}
			return g.waitBatch(cmd.Context(), c, args[0], timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 6*time.Hour, "stop waiting after this long (the batch's work goes on; exit 6)")
	return cmd
}
