package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	agentv1 "bcd/internal/gen/agentv1"
)

// Consoles is what the gateway's Console stream needs of the control plane: the operator's
// console sessions (package console, through the engine).
type Consoles interface {
	// AttachConsole checks that commandID is a bmc.console command assigned to site agent a and
	// not ended, and attaches a to the session the command serves. Errors: ErrNoConsole (no such
	// session open on this server, or the command is not a console's), ErrNotYourConsole.
	AttachConsole(ctx context.Context, a AgentRef, commandID string) (ConsoleEnd, error)
}

// ConsoleEnd is a site agent's side of one console session.
type ConsoleEnd interface {
	// Input yields what the operator typed, in order.
	Input() <-chan []byte
	// Closed is closed when the operator's side ended.
	Closed() <-chan struct{}
	// Output passes what the machine wrote to the operator (waits while the operator is behind).
	Output(ctx context.Context, data []byte) error
	// End ends the agent's side, with why (nil: normal).
	End(why error)
}

// Console errors.
const (
	ErrNoConsole      Error = "no console session is open on this server for that command"
	ErrNotYourConsole Error = "the console command is not assigned to this agent"
)

// MaxConsoleFrame bounds the data of one console frame, either way.
const MaxConsoleFrame = 64 << 10

// consoleAttachWait bounds the wait for the operator's session to be open when an agent
// attaches (the agent may run the command a moment before the opening server's own write
// returns).
const consoleAttachWait = 10 * time.Second

// Console implements bcd.agent.v1.GatewayService: see the proto.
func (s *Server) Console(ctx context.Context, stream *connect.BidiStream[agentv1.ConsoleFrame, agentv1.ConsoleFrame]) error {
	if s.cfg.Consoles == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this control plane relays no consoles"))
	}
	a, err := s.admitSiteAgent(ctx)
	if err != nil {
		return err
	}
	first, err := receiveWithin(ctx, stream, helloTimeout)
	if err != nil {
		return err
	}
	id := first.GetCommandId()
	if id == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("the first console frame names no command"))
	}
	actx, cancel := context.WithTimeout(ctx, consoleAttachWait)
	end, err := s.cfg.Consoles.AttachConsole(actx, a, id)
	cancel()
	switch {
	case errors.Is(err, ErrNoConsole):
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("console %s: %w", id, ErrNoConsole))
	case errors.Is(err, ErrNotYourConsole):
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("console %s: %w", id, ErrNotYourConsole))
	case err != nil:
		s.cfg.Logger.LogAttrs(ctx, slog.LevelError, "attaching a console", slog.String("agent", a.String()), slog.String("command", id), slog.Any("error", err))
		return connect.NewError(connect.CodeUnavailable, errors.New("attaching the console failed; try again"))
	}
	log := s.cfg.Logger.With(slog.String("agent", a.String()), slog.String("command", id))
	log.LogAttrs(ctx, slog.LevelInfo, "console attached")

	ctx, cancelRelay := context.WithCancel(ctx)
	defer cancelRelay()
	received := make(chan error, 1)
	go func() {
		f := first
		for {
			if len(f.GetData()) > MaxConsoleFrame {
				received <- fmt.Errorf("a console frame of %d bytes: at most %d are accepted", len(f.GetData()), MaxConsoleFrame)
				return
			}
			if len(f.GetData()) > 0 {
				if err := end.Output(ctx, f.GetData()); err != nil {
					received <- err
					return
				}
			}
			if why := f.GetEnd(); why != "" {
				received <- errors.New(truncateReason(why))
				return
			}
			var err error
			if f, err = stream.Receive(); err != nil {
				received <- err
				return
			}
		}
	}()
	recheck := time.NewTicker(s.cfg.RecheckInterval)
	defer recheck.Stop()
	for {
		select {
		case <-recheck.C:
			// As on the agent's main stream: a certificate revoked or expired since ends it.
			if _, err := s.admitSiteAgent(ctx); connect.CodeOf(err) == connect.CodePermissionDenied || connect.CodeOf(err) == connect.CodeUnauthenticated {
				end.End(errors.New("the site agent's certificate is refused now"))
				log.LogAttrs(ctx, slog.LevelWarn, "the agent's certificate is refused now: ending its console stream", slog.Any("error", err))
				return err
			}
		case b := <-end.Input():
			if err := stream.Send(&agentv1.ConsoleFrame{Data: b}); err != nil {
				end.End(fmt.Errorf("the site agent's console stream failed: %w", err))
				return err
			}
		case <-end.Closed():
			// The operator closed the session: ending the stream tells the agent.
			end.End(nil)
			log.LogAttrs(ctx, slog.LevelInfo, "console closed by the operator")
			return nil
		case err := <-received:
			switch {
			case errors.Is(err, io.EOF):
				end.End(errors.New("the site agent ended the session"))
			default:
				end.End(err)
			}
			log.LogAttrs(ctx, slog.LevelInfo, "console ended by the site agent", slog.Any("reason", err))
			return nil
		case <-ctx.Done():
			// The agent's last frame may have said why just before its stream closed.
			why := errors.New("the site agent's console stream went away")
			select {
			case err := <-received:
				if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, context.Canceled) {
					why = err
				}
			default:
			}
			end.End(why)
			return ctx.Err()
		}
	}
}

// receiveWithin receives a stream's first frame, waiting at most d.
func receiveWithin[T any](ctx context.Context, stream interface{ Receive() (*T, error) }, d time.Duration) (*T, error) {
	type got struct {
		m   *T
		err error
	}
	ch := make(chan got, 1)
	go func() {
		m, err := stream.Receive()
		ch <- got{m, err}
	}()
	select {
	case g := <-ch:
		return g.m, g.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(d):
		return nil, connect.NewError(connect.CodeDeadlineExceeded, errors.New("no first frame"))
	}
}

// truncateReason bounds an agent's reason as the operator sees it.
func truncateReason(s string) string {
	const max = 512
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}
