package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	bcdv1 "bcd/internal/gen/bcdv1"
)

// waitFlags are --wait and --wait-timeout of the verbs that start work on a node.
type waitFlags struct {
	wait    bool
	timeout time.Duration
}

func (w *waitFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&w.wait, "wait", false, "follow the node until it rests, its state, workflow step and command progress on stderr; exit 7 if it fails")
	cmd.Flags().DurationVar(&w.timeout, "wait-timeout", 2*time.Hour, "with --wait: stop waiting after this long (the node's work goes on; exit 6)")
}

// pollInterval is how often --wait reads the node.
const pollInterval = time.Second

// nodeFailedError is a node that failed while --wait followed it: its fault, as the node
// records it.
type nodeFailedError struct {
	node, from, code, message string
}

func (e *nodeFailedError) Error() string {
	msg := fmt.Sprintf("node %s failed while %s: %s", e.node, e.from, e.code)
	if e.message != "" {
		msg += " " + e.message
	}
	return msg + " (maintenance on; bcd node recover runs the failed step's workflow again)"
}

// resting reports whether the node has no work left to follow: its chain of workflows ended
// (no target state), or it failed. Pure.
func resting(n *bcdv1.Node) bool {
	return n.TargetState == "" || n.State == "failed"
}

// nodeStatus is one line saying where the node is: its state (and target), the workflow's step
// and the command's progress, a batch waiting for approval. Pure.
func nodeStatus(n *bcdv1.Node) string {
	var b strings.Builder
	b.WriteString(n.Name + ": " + n.State)
	if n.State == "failed" {
		b.WriteString(" " + n.FaultCode)
		return b.String()
	}
	if n.TargetState != "" && n.TargetState != n.State {
		b.WriteString(" → " + n.TargetState)
	}
	if n.Maintenance {
		b.WriteString(" (maintenance")
		if n.MaintenanceReason != "" {
			b.WriteString(": " + n.MaintenanceReason)
		}
		b.WriteString(")")
	}
	if a := n.Activity; a != nil && a.WorkflowState == "running" && a.Step < a.Steps {
		phase := "step"
		if a.Phase == "cleanup" {
			phase = "cleanup step"
		}
		fmt.Fprintf(&b, " · %s %s %d/%d %s", a.Workflow, phase, a.Step+1, a.Steps, a.StepName)
		if a.CommandKind != "" {
			b.WriteString(" · " + a.CommandKind + " " + a.CommandState)
			if a.ProgressTotal > 0 {
				fmt.Fprintf(&b, " %d%%", 100*a.ProgressDone/a.ProgressTotal)
			}
			if a.ProgressMessage != "" {
				b.WriteString(" " + a.ProgressMessage)
			}
		}
	}
	if n.BatchId != "" && n.TargetState != "" {
		b.WriteString(" · batch " + n.BatchId)
	}
	return b.String()
}

// statusWriter shows the status lines of a wait: on a terminal, one line redrawn in place;
// elsewhere (a log, a pipe) one line per change of what the node does, its progress in steps of
// 10 % at most, so that a log of a long image write stays short.
type statusWriter struct {
	w        io.Writer
	terminal bool
	last     string // the last line written, as compared (progress in tens)
	width    int    // the terminal line's length, to blank what a shorter line leaves
}

func (s *statusWriter) show(n *bcdv1.Node) {
	line := nodeStatus(n)
	key := line
	if a := n.Activity; a != nil && a.ProgressTotal > 0 {
		key = strings.Replace(line, fmt.Sprintf(" %d%%", 100*a.ProgressDone/a.ProgressTotal), fmt.Sprintf(" %d0%%", 10*a.ProgressDone/a.ProgressTotal), 1)
	}
	s.showLine(line, key)
}

// showLine shows a status line: on a terminal whenever it changes; elsewhere only when key
// (the line with its progress in coarse steps) changes.
func (s *statusWriter) showLine(line, key string) {
	if s.terminal {
		if line == s.last {
			return
		}
		pad := max(s.width-len(line), 0)
		fmt.Fprintf(s.w, "\r%s%s", line, strings.Repeat(" ", pad))
		s.last, s.width = line, len(line)
		return
	}
	if key == s.last {
		return
	}
	fmt.Fprintln(s.w, line)
	s.last = key
}

// end finishes the terminal's redrawn line.
func (s *statusWriter) end() {
	if s.terminal && s.width > 0 {
		fmt.Fprintln(s.w)
	}
}

// follow reads the node every interval until it rests, showing its status, for at most
// timeout: the node at rest, a *nodeFailedError when it failed, or the context's error (a
// deadline when the wait ran out) wrapped with where the node was.
func follow(ctx context.Context, get func(context.Context) (*bcdv1.Node, error), status *statusWriter, interval, timeout time.Duration) (*bcdv1.Node, error) {
	n, err := followUntil(ctx, followed[*bcdv1.Node]{what: "node", show: "bcd node get", get: get,
		done: func(n *bcdv1.Node) bool { status.show(n); return resting(n) }, describe: nodeStatus}, status, interval, timeout)
	if err == nil && n.State == "failed" {
		return n, &nodeFailedError{node: n.Name, from: n.FailedFrom, code: n.FaultCode, message: n.FaultMessage}
	}
	return n, err
}

// followed is what a wait follows: a node, a batch.
type followed[T any] struct {
	what, show string                           // its name ("node") and the command that shows it
	get        func(context.Context) (T, error) // reads it
	done       func(T) bool                     // shows it, and says whether the wait is over
	describe   func(T) string                   // where it is, for a wait that ran out
}

// followUntil reads f every interval until f.done says the wait is over, for at most timeout:
// its last reading, or the context's error (a deadline when the wait ran out) wrapped with
// where it was. An unavailable server is asked again: the work goes on while it restarts.
func followUntil[T any](ctx context.Context, f followed[T], status *statusWriter, interval, timeout time.Duration) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	defer status.end()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var last T
	read := false
	for {
		got, err := f.get(ctx)
		switch {
		case err == nil:
			last, read = got, true
			if f.done(last) {
				return last, nil
			}
		case ctx.Err() == nil && connect.CodeOf(err) == connect.CodeUnavailable:
			// The server restarted or the network blinked: the work goes on, keep asking.
		default:
			return last, fmt.Errorf("following the %s: %w", f.what, err)
		}
		select {
		case <-ctx.Done():
			where := "not read yet"
			if read {
				where = f.describe(last)
			}
			err := ctx.Err()
			if errors.Is(err, context.DeadlineExceeded) {
				return last, fmt.Errorf("stopped waiting after %s (the %s's work goes on; %s shows it): %s: %w", timeout, f.what, f.show, where, err)
			}
			return last, fmt.Errorf("stopped waiting (the %s's work goes on): %s: %w", f.what, where, err)
		case <-tick.C:
		}
	}
}

// nodeVerbWait runs one node call and prints the node it answers with; with --wait it then
// follows the node until it rests and prints it as it rests.
func (g *globals) nodeVerbWait(cmd *cobra.Command, w waitFlags, call func(context.Context, *clients) (*connect.Response[bcdv1.NodeResponse], error)) error {
	if w.wait && w.timeout <= 0 {
		return usagef("--wait-timeout %s: give a duration above zero (e.g. 30m)", w.timeout)
	}
	c, err := g.clients()
	if err != nil {
		return err
	}
	resp, err := call(cmd.Context(), c)
	if err != nil {
		return err
	}
	if !w.wait {
		return g.printNode(resp.Msg.Node)
	}
	id := resp.Msg.Node.Id
	get := func(ctx context.Context) (*bcdv1.Node, error) {
		r, err := c.nodes.Get(ctx, connect.NewRequest(&bcdv1.GetNodeRequest{Node: id}))
		if err != nil {
			return nil, err
		}
		return r.Msg.Node, nil
	}
	status := &statusWriter{w: g.env.Stderr, terminal: isTerminal(g.env.Stderr)}
	n, err := follow(cmd.Context(), get, status, pollInterval, w.timeout)
	if n != nil {
		if perr := g.printNode(n); perr != nil && err == nil {
			err = perr
		}
	}
	return err
}
