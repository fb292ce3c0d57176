package ipmibmc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"

	"github.com/bougou/go-ipmi/pkg/hal"
)

// serialBufferCap bounds the machine's output read from its serial port and not yet taken by the
// SOL payload; past it the serial port is not read (QEMU then holds the guest's output).
const serialBufferCap = 64 << 10

// consoleHAL is go-ipmi's console: activating the SOL payload opens the machine's serial port,
// deactivating it (or closing the owning session) closes it.
type consoleHAL struct{ b *BMC }

// serialOpener is how a BMC of cfg opens the machine's serial port, or nil when it has none
// (SOL is then not offered: activation answers "payload type disabled").
func serialOpener(cfg Config) (func(context.Context) (io.ReadWriteCloser, error), error) {
	switch {
	case cfg.Serial != nil && cfg.SerialSocket != "":
		return nil, errors.New("serial console: set SerialSocket or Serial, not both")
	case cfg.Serial != nil:
		return cfg.Serial, nil
	case cfg.SerialSocket != "":
		path := cfg.SerialSocket
		return func(ctx context.Context) (io.ReadWriteCloser, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", path)
			if err != nil {
				return nil, fmt.Errorf("connecting to the machine's serial port %s: %w", path, err)
			}
			return c, nil
		}, nil
	}
	return nil, nil
}

func (h consoleHAL) Open(ctx context.Context) (hal.ConsoleConn, error) {
	rwc, err := h.b.serial(ctx)
	if err != nil {
		h.b.log.Warn("SOL activation: cannot open the serial port", "err", err)
		return nil, err
	}
	h.b.log.Info("SOL activated: serial port open")
	return newSerialConn(rwc, h.b.log), nil
}

// serialConn adapts a serial port stream to go-ipmi's hal.ConsoleConn, whose reads must never
// block: a goroutine reads the port into a bounded buffer that ReadAvailable drains.
type serialConn struct {
	rwc io.ReadWriteCloser
	log *slog.Logger

	mu     sync.Mutex
	space  *sync.Cond // signalled when buf shrinks or the conn closes
	buf    []byte
	err    error // the read error that ended the reader, returned once buf is drained
	closed bool

	closeOnce sync.Once
}

func newSerialConn(rwc io.ReadWriteCloser, log *slog.Logger) *serialConn {
	c := &serialConn{rwc: rwc, log: log}
	c.space = sync.NewCond(&c.mu)
	go c.readLoop()
	return c
}

func (c *serialConn) readLoop() {
	chunk := make([]byte, 4096)
	for {
		c.mu.Lock()
		for len(c.buf) >= serialBufferCap && !c.closed {
			c.space.Wait()
		}
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return
		}
		n, err := c.rwc.Read(chunk)
		c.mu.Lock()
		c.buf = append(c.buf, chunk[:n]...)
		if err != nil && !c.closed {
			if errors.Is(err, io.EOF) {
				err = errors.New("the machine's serial port closed")
			}
			c.err = err
		}
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// ReadAvailable copies the output read so far; once the port failed and its output is drained
// it returns the failure (go-ipmi then reports the console unavailable).
func (c *serialConn) ReadAvailable(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	if n > 0 {
		c.space.Signal()
		return n, nil
	}
	if c.err != nil {
		return 0, c.err
	}
	return 0, nil
}

func (c *serialConn) Write(p []byte) (int, error) { return c.rwc.Write(p) }

// SendBreak: a unix socket has no BREAK.
func (c *serialConn) SendBreak(context.Context) error { return hal.ErrNotSupported }

func (c *serialConn) Close() error {
	var err error
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.space.Broadcast()
		c.mu.Unlock()
		err = c.rwc.Close()
		c.log.Info("SOL deactivated: serial port closed")
	})
	return err
}
