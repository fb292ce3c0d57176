package site

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"bcd/internal/bmc"
)

// ConsoleConn is the site agent's end of an operator's console session: the gateway's Console
// stream for one bmc.console command (agentlink.ConsoleStream). Read yields what the operator
// types (io.EOF: the operator closed the session), Write passes what the machine writes, End
// tells the operator why the session ends on this side (nil: a normal end).
type ConsoleConn interface {
	io.Reader
	io.Writer
	End(ctx context.Context, why error)
}

// ConsoleDialer opens the console stream of a bmc.console command.
type ConsoleDialer func(ctx context.Context, commandID string) (ConsoleConn, error)

// consoleResult is bmc.console's result: how long the session lasted and what crossed it.
type consoleResult struct {
	Seconds  int64  `json:"seconds"`
	BytesIn  int64  `json:"bytesIn"`
	BytesOut int64  `json:"bytesOut"`
	Ended    string `json:"ended"`
}

// errConsoleTimeUp ends a session at its command's deadline (the length the operator asked).
var errConsoleTimeUp = errors.New("the session reached its maximum length")

// MaxConsoleSessions bounds the console sessions one site agent relays at once. They run beside
// the command slots (agentlink.Config.Sessions): each is a goroutine pair, an IPMI session and a
// gateway stream, not a workflow's slot.
const MaxConsoleSessions = 64

// bmcConsole relays an operator's console session between the gateway and the BMC's
// Serial-over-LAN until either side ends it. It takes no BMC lock: the console is a session of
// its own beside the workflows' BMC calls, which it must never hold up for its length.
func (h *handler) bmcConsole(ctx context.Context, a commandArgs) (any, error) {
	if h.console == nil {
		return nil, errors.New("this site agent relays no consoles (it has no gateway link)")
	}
	if n := h.consoles.Add(1); n > MaxConsoleSessions {
		h.consoles.Add(-1)
		return nil, fmt.Errorf("this site agent relays %d console sessions already, the most it takes: close one", MaxConsoleSessions)
	}
	defer h.consoles.Add(-1)
	ref, _, ep, err := h.endpoint(ctx, a)
	if err != nil {
		return nil, err
	}
	conn, err := h.console(ctx, a.commandID)
	if err != nil {
		return nil, err
	}
	started := time.Now()
	var in, out atomic.Int64
	err = withDriverCounted(ctx, h.drivers, ref.Driver, ep, "console", capConsole, h.metrics, func(ctx context.Context, drv any) error {
		return drv.(bmc.Consoler).Console(ctx, countingReader{conn, &in}, countingWriter{conn, &out}, bmc.ConsoleOptions{TakeOver: bool(a.TakeOver)})
	})
	why := err
	if err == nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		why = errConsoleTimeUp
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	conn.End(ectx, why)
	cancel()
	res := consoleResult{Seconds: int64(time.Since(started).Seconds()), BytesIn: in.Load(), BytesOut: out.Load(), Ended: "closed by the operator"}
	if why != nil {
		res.Ended = why.Error()
	}
	h.log.InfoContext(ctx, "console session ended", "node", a.NodeID, "seconds", res.Seconds, "bytesIn", res.BytesIn, "bytesOut", res.BytesOut, "ended", res.Ended)
	return res, err
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n.Add(int64(n))
	return n, err
}
