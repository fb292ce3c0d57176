package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/auth"
	"bcd/internal/bmc"
	"bcd/internal/console"
	"bcd/internal/gen/bcdv1"
	"bcd/internal/metal"
)

// consoleAttachTimeout bounds the wait for a site agent to take a console session.
const consoleAttachTimeout = 2 * time.Minute

// consoleInputTimeout bounds the wait for a session to take one input.
const consoleInputTimeout = 10 * time.Second

// Console implements bcd.v1.NodeService: see the proto.
func (h *nodes) Console(ctx context.Context, req *connect.Request[bcdv1.ConsoleRequest], stream *connect.ServerStream[bcdv1.ConsoleOutput]) error {
	if h.consoles == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this server relays no consoles (it runs no agent gateway)"))
	}
	p := principal(ctx)
	m := req.Msg
	n, cmd, err := h.svc.OpenConsole(ctx, p, metal.ConsoleInput{Node: m.Node, Reason: m.Reason, TakeOver: m.TakeOver, ReadOnly: m.ReadOnly,
		Max: time.Duration(m.MaxSeconds) * time.Second, Server: h.consoles.Server()})
	if err != nil {
		return toConnect(err)
	}
	sess, err := h.consoles.Open(console.Info{ID: cmd.ID, NodeID: n.ID, TenantID: n.TenantID, Owner: p.TokenID, ReadOnly: m.ReadOnly})
	if err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	opened := time.Now()
	why, err := sess.Serve(ctx, consoleAttachTimeout, apiSender{stream: stream, id: cmd.ID})
	sess.Close()
	in, out := sess.Bytes()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if cerr := h.svc.CloseConsole(cctx, p, n, cmd.ID, time.Since(opened), in, out, why); cerr != nil {
		h.log.LogAttrs(cctx, slog.LevelError, "recording a console session's end", slog.String("node", n.ID), slog.String("command", cmd.ID), slog.Any("error", cerr))
	}
	switch {
	case errors.Is(err, console.ErrNoAgent):
		return connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf("no site agent took the console of node %s within %s: is an agent of its site connected (bcd site agents)?", n.Name, consoleAttachTimeout))
	case err != nil && ctx.Err() != nil:
		return nil // the operator closed the session
	}
	return err
}

// apiSender sends a session's side to the API stream; every status names the session.
type apiSender struct {
	stream *connect.ServerStream[bcdv1.ConsoleOutput]
	id     string
}

func (a apiSender) Status(s string) error {
	return a.stream.Send(&bcdv1.ConsoleOutput{SessionId: a.id, Status: s})
}

func (a apiSender) Data(b []byte) error { return a.stream.Send(&bcdv1.ConsoleOutput{Data: b}) }

// ConsoleInput implements bcd.v1.NodeService: see the proto.
func (h *nodes) ConsoleInput(ctx context.Context, req *connect.Request[bcdv1.ConsoleInputRequest]) (*connect.Response[bcdv1.ConsoleInputResponse], error) {
	p := principal(ctx)
	if err := metal.Require(p, auth.Operate); err != nil {
		return nil, toConnect(err)
	}
	m := req.Msg
	if len(m.Data) == 0 || len(m.Data) > bmc.MaxConsoleInput {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("data: %d bytes; 1-%d are accepted in one call", len(m.Data), bmc.MaxConsoleInput))
	}
	if h.consoles == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this server relays no consoles"))
	}
	sess, ok := h.consoles.Lookup(m.SessionId)
	if !ok || !p.CanSeeTenant(sess.TenantID) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no console session %q is open on this server (input goes to the server that holds the session's output stream)", truncateID(m.SessionId)))
	}
	if sess.Owner != p.TokenID {
		return nil, connect.NewError(connect.CodePermissionDenied, errors.New("only the token that opened a console session types into it"))
	}
	ictx, cancel := context.WithTimeout(ctx, consoleInputTimeout)
	defer cancel()
	switch err := sess.Input(ictx, m.Data); {
	case errors.Is(err, console.ErrReadOnly), errors.Is(err, console.ErrClosed):
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	case err != nil:
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	return connect.NewResponse(&bcdv1.ConsoleInputResponse{}), nil
}

// truncateID bounds an id quoted back in an error.
func truncateID(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
