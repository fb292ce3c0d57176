// Package qmp is a small client for QEMU's machine protocol (QMP) over a unix socket: the lab's
// virtual BMCs drive their VM through it (LAB-NOTES gotcha 10).
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Event is an asynchronous QMP event (SHUTDOWN, STOP, RESUME, RESET, …).
type Event struct {
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data,omitempty"`
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

// Error is an error QEMU answered to a command.
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string { return fmt.Sprintf("qmp %s: %s", e.Class, e.Desc) }

// message is any line QEMU sends.
type message struct {
	QMP    json.RawMessage `json:"QMP,omitempty"`
	Return json.RawMessage `json:"return,omitempty"`
	Error  *Error          `json:"error,omitempty"`
	Event  string          `json:"event,omitempty"`
	ID     json.RawMessage `json:"id,omitempty"`
}

type request struct {
	Execute   string `json:"execute"`
	Arguments any    `json:"arguments,omitempty"`
	ID        uint64 `json:"id"`
}

type reply struct {
	ret json.RawMessage
	err error
}

// maxEvents bounds the recorded events: older ones are dropped.
const maxEvents = 256

// Client is a QMP connection. It is safe for concurrent use: commands carry an id and replies
// are matched to them, events are recorded on the side.
type Client struct {
	path string
	conn net.Conn

	writeMu sync.Mutex // one command on the wire at a time

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan reply
	events  []Event
	readErr error
	done    chan struct{}
}

// Dial connects to the QMP socket at path, reads the greeting and negotiates capabilities.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("dialing QMP socket %s: %w", path, err)
	}
	c := &Client{path: path, conn: conn, pending: map[uint64]chan reply{}, done: make(chan struct{})}
	r := bufio.NewReaderSize(conn, 64<<10)
	if err := c.greeting(ctx, r); err != nil {
		_ = conn.Close()
		return nil, err
	}
	go c.readLoop(r)
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("negotiating QMP capabilities on %s: %w", path, err)
	}
	return c, nil
}

func (c *Client) greeting(ctx context.Context, r *bufio.Reader) error {
	type result struct {
		line []byte
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		line, err := r.ReadBytes('\n')
		ch <- result{line, err}
	}()
	var res result
	select {
	case res = <-ch:
	case <-ctx.Done():
		_ = c.conn.Close()
		<-ch
		return fmt.Errorf("reading QMP greeting on %s: %w", c.path, ctx.Err())
	}
	if res.err != nil {
		return fmt.Errorf("reading QMP greeting on %s: %w", c.path, res.err)
	}
	var m message
	if err := json.Unmarshal(res.line, &m); err != nil || m.QMP == nil {
		return fmt.Errorf("reading QMP greeting on %s: not a QMP greeting: %q", c.path, truncate(res.line))
	}
	return nil
}

func truncate(b []byte) string {
	if len(b) > 120 {
		return string(b[:120]) + "…"
	}
	return string(b)
}

func (c *Client) readLoop(r *bufio.Reader) {
	var err error
	for {
		var line []byte
		line, err = r.ReadBytes('\n')
		if len(line) > 0 {
			c.dispatch(line)
		}
		if err != nil {
			break
		}
	}
	c.mu.Lock()
	c.readErr = fmt.Errorf("QMP connection %s closed: %w", c.path, err)
	for id, ch := range c.pending {
		ch <- reply{err: c.readErr}
		delete(c.pending, id)
	}
	c.mu.Unlock()
	close(c.done)
}

// dispatch routes one line from QEMU: an event is recorded, a reply goes to its waiter.
func (c *Client) dispatch(line []byte) {
	var m message
	if err := json.Unmarshal(line, &m); err != nil {
		return // garbage from the peer: ignore it rather than die
	}
	if m.Event != "" {
		var ev Event
		if json.Unmarshal(line, &ev) == nil {
			c.mu.Lock()
			c.events = append(c.events, ev)
			if len(c.events) > maxEvents {
				c.events = append([]Event(nil), c.events[len(c.events)-maxEvents:]...)
			}
			c.mu.Unlock()
		}
		return
	}
	var id uint64
	if len(m.ID) == 0 || json.Unmarshal(m.ID, &id) != nil {
		return // a reply we did not ask for
	}
	c.mu.Lock()
	ch, ok := c.pending[id]
	delete(c.pending, id)
	c.mu.Unlock()
	if !ok {
		return
	}
	if m.Error != nil {
		ch <- reply{err: m.Error}
		return
	}
	ch <- reply{ret: m.Return}
}

// Execute runs cmd with args (nil for none) and decodes its return value into out (nil to
// discard it). A QEMU error is returned as *Error.
func (c *Client) Execute(ctx context.Context, cmd string, args any, out any) error {
	ch := make(chan reply, 1)
	c.mu.Lock()
	if c.readErr != nil {
		err := c.readErr
		c.mu.Unlock()
		return fmt.Errorf("executing QMP %s: %w", cmd, err)
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()

	b, err := json.Marshal(request{Execute: cmd, Arguments: args, ID: id})
	if err != nil {
		c.forget(id)
		return fmt.Errorf("encoding QMP %s: %w", cmd, err)
	}
	b = append(b, '\n')
	c.writeMu.Lock()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.conn.SetWriteDeadline(dl)
	}
	_, err = c.conn.Write(b)
	_ = c.conn.SetWriteDeadline(time.Time{})
	c.writeMu.Unlock()
	if err != nil {
		c.forget(id)
		return fmt.Errorf("sending QMP %s to %s: %w", cmd, c.path, err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("executing QMP %s: %w", cmd, r.err)
		}
		if out != nil {
			if err := json.Unmarshal(r.ret, out); err != nil {
				return fmt.Errorf("decoding QMP %s reply: %w", cmd, err)
			}
		}
		return nil
	case <-ctx.Done():
		c.forget(id)
		return fmt.Errorf("executing QMP %s: %w", cmd, ctx.Err())
	}
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// Events returns the events received so far (at most the last 256) and forgets them.
func (c *Client) Events() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	ev := c.events
	c.events = nil
	return ev
}

// Done is closed once the connection has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

// Close ends the connection and waits for the reader to stop.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("closing QMP connection %s: %w", c.path, err)
	}
	return nil
}
