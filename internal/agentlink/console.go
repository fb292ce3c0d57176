package agentlink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"connectrpc.com/connect"

	agentv1 "bcd/internal/gen/agentv1"
)

// maxConsoleFrame bounds the data of one console frame the agent sends (the gateway's bound).
const maxConsoleFrame = 64 << 10

// ConsoleStream is a site agent's side of one operator console session, over the gateway's
// Console stream: Read yields what the operator types (io.EOF once the operator closed the
// session), Write passes what the machine writes. One reader and one writer at a time; End
// may be called while a Read waits.
type ConsoleStream struct {
	stream *connect.BidiStreamForClient[agentv1.ConsoleFrame, agentv1.ConsoleFrame]

	in      chan []byte   // frames received, by the one receiver; closed when it stops (err set)
	done    chan struct{} // closed when the receiver stopped
	err     error
	pending []byte // input received and not yet read

	mu    sync.Mutex // serialises sends
	ended bool
}

// Console opens the gateway's console stream for commandID, a bmc.console command this agent
// runs. The gateway answers an unknown or foreign session at the first Read (Write then fails).
func (l *Link) Console(ctx context.Context, commandID string) (*ConsoleStream, error) {
	s := l.client().Console(ctx)
	if err := s.Send(&agentv1.ConsoleFrame{CommandId: commandID}); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("opening the console stream: %w", err)
	}
	c := &ConsoleStream{stream: s, in: make(chan []byte, 16), done: make(chan struct{})}
	go c.receive()
	return c, nil
}

// receive pumps the gateway's frames to Read until the stream ends, then closes in.
func (c *ConsoleStream) receive() {
	defer close(c.done)
	defer close(c.in)
	for {
		f, err := c.stream.Receive()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				c.err = fmt.Errorf("console stream: %w", err)
			}
			return
		}
		if len(f.GetData()) > 0 {
			c.in <- f.GetData()
		}
	}
}

// Read implements io.Reader: io.EOF once the operator closed the session, the gateway's
// refusal if it refused the stream.
func (c *ConsoleStream) Read(p []byte) (int, error) {
	for len(c.pending) == 0 {
		b, ok := <-c.in
		if !ok {
			if c.err != nil {
				return 0, c.err
			}
			return 0, io.EOF
		}
		c.pending = b
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// Write implements io.Writer.
func (c *ConsoleStream) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ended {
		return 0, errors.New("console stream: ended")
	}
	for off := 0; off < len(p); off += maxConsoleFrame {
		chunk := p[off:min(off+maxConsoleFrame, len(p))]
		if err := c.stream.Send(&agentv1.ConsoleFrame{Data: chunk}); err != nil {
			if errors.Is(err, io.EOF) {
				// The gateway ended the stream: its reason reaches the receiver.
				err = errors.New("the gateway ended the stream")
				select {
				case <-c.done:
					if c.err != nil {
						err = c.err
					}
				case <-time.After(time.Second):
				}
			}
			return off, fmt.Errorf("console stream: %w", err)
		}
	}
	return len(p), nil
}

// End ends the agent's side: why (nil: a normal end) reaches the operator. It waits, until ctx
// ends, for the gateway to end the stream. Idempotent.
func (c *ConsoleStream) End(ctx context.Context, why error) {
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return
	}
	c.ended = true
	if why != nil {
		// The last frame says why; a stream the gateway already ended refuses it, harmlessly.
		_ = c.stream.Send(&agentv1.ConsoleFrame{End: why.Error()})
	}
	_ = c.stream.CloseRequest()
	c.mu.Unlock()
	// Frames the operator sent after the end are dropped (nothing reads them any more) until
	// the gateway ends the stream.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range c.in {
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	_ = c.stream.CloseResponse()
}
