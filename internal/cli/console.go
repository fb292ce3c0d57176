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

	"bcd/internal/bmc"
	"bcd/internal/console"
	"bcd/internal/gen/bcdv1"
)

// consoleCmd is `bcd node console`: the node's serial console in the terminal.
func consoleCmd(g *globals) *cobra.Command {
	var in bcdv1.ConsoleRequest
	var max time.Duration
	cmd := &cobra.Command{
		Use:   "console NODE",
		Short: "Attach to the node's serial console (IPMI Serial-over-LAN, through a site agent); ~. at a line's start leaves",
		Long: `Attach to the node's serial console, in any state: what the machine writes is printed as it
arrives, and what you type goes to the machine (the terminal is put in raw mode). Type ~. at the
start of a line to leave, ~~ for a literal ~. --read-only watches without typing (leave with
Ctrl-C). The session ends at --max, when you leave, or when the BMC ends it. Who opened it, and
how much crossed it, is recorded in the node's events.`,
		Args: exactArgs(1, "NODE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			in.Node = args[0]
			in.MaxSeconds = int64(max / time.Second)
			c, err := g.clients()
			if err != nil {
				return err
			}
			return runConsole(cmd.Context(), g, c, &in, cmd.InOrStdin())
		},
	}
	cmd.Flags().BoolVar(&in.ReadOnly, "read-only", false, "watch only: nothing typed is sent")
	cmd.Flags().BoolVar(&in.TakeOver, "take-over", false, "end another client's session on the console first")
	cmd.Flags().DurationVar(&max, "max", time.Hour, "longest the session may last (1m to 24h)")
	cmd.Flags().StringVar(&in.Reason, "reason", "", "why (recorded in the event log)")
	return cmd
}

// runConsole relays one session between the terminal and the API until it ends.
func runConsole(ctx context.Context, g *globals, c *clients, in *bcdv1.ConsoleRequest, stdin io.Reader) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.nodes.Console(ctx, connect.NewRequest(in))
	if err != nil {
		return err
	}
	defer stream.Close()
	say := func(format string, a ...any) { fmt.Fprintf(g.env.Stderr, "[bcd] "+format+"\r\n", a...) }
	quit := make(chan struct{})
	typed := make(chan error, 1)
	// left says whether the operator left (~.: nil) or the input failed (its error); ~. is
	// looked at first, as it ends the input too.
	left := func() (bool, error) {
		select {
		case <-quit:
			say("left the console")
			return true, nil
		default:
		}
		select {
		case err := <-typed:
			if err != nil {
				return true, fmt.Errorf("sending input: %w", err)
			}
		default:
		}
		return false, nil
	}
	started := false
	var sessionID string
	for stream.Receive() {
		m := stream.Msg()
		if m.SessionId != "" {
			sessionID = m.SessionId
		}
		if m.Status != "" {
			say("%s", m.Status)
		}
		if !started && strings.HasPrefix(m.Status, "connected") {
			// Connected: type from now on.
			started = true
			if in.ReadOnly {
				say("read-only: leave with Ctrl-C")
			} else {
				restore := console.RawTerminal(stdin)
				defer restore()
				say("type ~. at the start of a line to leave")
				id := sessionID
				go func() {
					err := sendTyped(ctx, c, id, stdin, quit)
					typed <- err
					select {
					case <-quit:
						cancel() // ~.: end the stream (the server closes the session)
					default:
						if err != nil {
							cancel()
						}
					}
				}()
			}
		}
		if len(m.Data) > 0 {
			if _, err := g.env.Stdout.Write(m.Data); err != nil {
				return err
			}
		}
		if done, err := left(); done {
			return err
		}
	}
	if done, err := left(); done {
		return err
	}
	if err := stream.Err(); err != nil {
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil
		}
		return err
	}
	return nil
}

// sendTyped sends what the operator types, through the escape filter, until ~. (quit closed),
// stdin's end, or an error. Each read is one ConsoleInput call (at most bmc.MaxConsoleInput
// bytes), in order.
func sendTyped(ctx context.Context, c *clients, id string, stdin io.Reader, quit chan<- struct{}) error {
	buf := make([]byte, bmc.MaxConsoleInput/2) // a filtered read grows by at most one byte per ~
	var esc console.Escaper
	for {
		n, err := stdin.Read(buf)
		if n > 0 {
			out, leave := esc.Feed(buf[:n])
			if len(out) > 0 {
				if _, serr := c.nodes.ConsoleInput(ctx, connect.NewRequest(&bcdv1.ConsoleInputRequest{SessionId: id, Data: out})); serr != nil {
					if ctx.Err() != nil {
						return nil
					}
					return serr
				}
			}
			if leave {
				close(quit)
				return nil
			}
		}
		if err != nil {
			return nil // stdin ended: keep watching until the session ends
		}
	}
}
