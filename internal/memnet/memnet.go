// Package memnet is a network inside one process: a listener, and connections to it that are
// in-memory pipes with a buffer in each direction, holding no file descriptor. bcd sim runs
// its simulated agents' connections to the gateway of the server in the same process over one:
// as loopback TCP, each of 10 000 machines' connections held two descriptors in the process,
// past this machine's limit on open files.
//
// A connection behaves as a TCP one does for what its users look at: reads and writes with
// deadlines (os.ErrDeadlineExceeded, a timeout), a write that blocks while the peer's buffer
// is full (bufferSize), end of file once the peer closed and its bytes are read, and a write
// to a peer that closed fails. Unlike net.Pipe's, a write returns once its bytes are buffered,
// as on TCP, not once the peer has read them all: the writer does not wait for the peer's
// reader at every TLS record and HTTP/2 frame.
package memnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Addr is an address on a memnet network.
type Addr string

// Network is "memnet".
func (Addr) Network() string { return "memnet" }

func (a Addr) String() string { return string(a) }

// Listener accepts the connections DialContext makes to it.
type Listener struct {
	addr    Addr
	pending chan net.Conn // the server end of a dial, until Accept takes it
	closed  chan struct{}
	once    sync.Once
	dials   atomic.Uint64
}

// Listen returns a listener at addr (any name: it is the address its connections report).
func Listen(addr string) *Listener {
	return &Listener{addr: Addr(addr), pending: make(chan net.Conn), closed: make(chan struct{})}
}

// Accept waits for a dial, and returns the connection's end at the listener; after Close it
// returns net.ErrClosed.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.pending:
		return c, nil
	case <-l.closed:
		return nil, &net.OpError{Op: "accept", Net: "memnet", Addr: l.addr, Err: net.ErrClosed}
	}
}

// Close stops Accept and refuses dials from then on; connections already made stay open.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

// Addr is the listener's address.
func (l *Listener) Addr() net.Addr { return l.addr }

// errRefused: a dial to a listener that was closed.
var errRefused = errors.New("connection refused: the listener is closed")

// DialContext connects to l and returns the connection's end at the dialler, once Accept took
// the other end (the listener keeps no backlog). The network and address are not looked at: it
// has the signature of net.Dialer's so that an http.Transport can dial with it, whatever its
// URL names. It fails if l is closed, or ctx ends first.
func (l *Listener) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	client := Addr(fmt.Sprintf("%s-client-%d", l.addr, l.dials.Add(1)))
	dialer, accepted := Pipe(client, l.addr)
	select {
	case l.pending <- accepted:
		return dialer, nil
	case <-l.closed:
		return nil, &net.OpError{Op: "dial", Net: "memnet", Addr: l.addr, Err: errRefused}
	case <-ctx.Done():
		return nil, &net.OpError{Op: "dial", Net: "memnet", Addr: l.addr, Err: ctx.Err()}
	}
}

// bufferSize is the most one direction of a connection holds unread: a write waits for the
// reader beyond it. It is above a TLS record and an HTTP/2 frame of the gateway (16 KiB each).
const bufferSize = 256 << 10

// Pipe returns the two ends of a connection: what one writes the other reads. a's local address
// is aAddr and its remote one bAddr; b's the reverse.
func Pipe(aAddr, bAddr Addr) (a, b net.Conn) {
	ab, ba := newHalf(), newHalf()
	return newConn(ba, ab, aAddr, bAddr), newConn(ab, ba, bAddr, aAddr)
}

// half is one direction of a connection: the bytes one end wrote that the other has not read.
type half struct {
	mu   sync.Mutex
	buf  []byte // unread, in order (nil when empty: an idle connection holds no buffer)
	eof  bool   // the writing end closed: the reader gets io.EOF once buf is read
	gone bool   // the reading end closed: writes fail
	// readable and writable hold a token when something changed that a waiting reader or
	// writer must look at again (a token is never lost: it stays until taken).
	readable, writable chan struct{}
}

func newHalf() *half {
	return &half{readable: make(chan struct{}, 1), writable: make(chan struct{}, 1)}
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

type conn struct {
	in, out       *half // in: what this end reads; out: what it writes
	local, remote Addr
	readDL        deadline
	writeDL       deadline
	closed        chan struct{}
	once          sync.Once
	// writing is held through a Write: writes of several goroutines do not interleave their
	// bytes, as on a TCP connection.
	writing sync.Mutex
}

func newConn(in, out *half, local, remote Addr) *conn {
	return &conn{in: in, out: out, local: local, remote: remote, readDL: newDeadline(), writeDL: newDeadline(), closed: make(chan struct{})}
}

func (c *conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "memnet", Source: c.local, Addr: c.remote, Err: err}
}

func (c *conn) Read(b []byte) (int, error) {
	h := c.in
	for {
		select {
		case <-c.closed:
			return 0, c.opError("read", net.ErrClosed)
		case <-c.readDL.passed():
			return 0, c.opError("read", os.ErrDeadlineExceeded)
		default:
		}
		h.mu.Lock()
		if len(h.buf) > 0 {
			n := copy(b, h.buf)
			h.buf = h.buf[n:]
			left := len(h.buf) > 0
			if !left {
				h.buf = nil
			}
			h.mu.Unlock()
			poke(h.writable)
			if left {
				poke(h.readable) // for another reader waiting
			}
			return n, nil
		}
		eof := h.eof
		h.mu.Unlock()
		if eof {
			return 0, io.EOF
		}
		if len(b) == 0 {
			return 0, nil
		}
		select {
		case <-h.readable:
		case <-c.readDL.passed():
		case <-c.closed:
		}
	}
}

func (c *conn) Write(b []byte) (int, error) {
	c.writing.Lock()
	defer c.writing.Unlock()
	h := c.out
	n := 0
	for {
		select {
		case <-c.closed:
			return n, c.opError("write", net.ErrClosed)
		case <-c.writeDL.passed():
			return n, c.opError("write", os.ErrDeadlineExceeded)
		default:
		}
		h.mu.Lock()
		if h.gone {
			h.mu.Unlock()
			return n, c.opError("write", io.ErrClosedPipe)
		}
		if room := bufferSize - len(h.buf); room > 0 {
			k := min(room, len(b)-n)
			h.buf = append(h.buf, b[n:n+k]...)
			n += k
			h.mu.Unlock()
			poke(h.readable)
			if n == len(b) {
				return n, nil
			}
			continue
		}
		h.mu.Unlock()
		select {
		case <-h.writable:
		case <-c.writeDL.passed():
		case <-c.closed:
		}
	}
}

// Close ends this end: the peer reads what was written before it, then io.EOF, and its writes
// fail. What the peer wrote and this end had not read is dropped.
func (c *conn) Close() error {
	closed := false
	c.once.Do(func() {
		closed = true
		close(c.closed)
		c.out.mu.Lock()
		c.out.eof = true
		c.out.mu.Unlock()
		poke(c.out.readable)
		c.in.mu.Lock()
		c.in.gone, c.in.buf = true, nil
		c.in.mu.Unlock()
		poke(c.in.writable)
		c.readDL.stop()
		c.writeDL.stop()
	})
	if !closed {
		return c.opError("close", net.ErrClosed)
	}
	return nil
}

func (c *conn) LocalAddr() net.Addr  { return c.local }
func (c *conn) RemoteAddr() net.Addr { return c.remote }

func (c *conn) SetDeadline(t time.Time) error {
	c.readDL.set(t)
	c.writeDL.set(t)
	return nil
}

func (c *conn) SetReadDeadline(t time.Time) error  { c.readDL.set(t); return nil }
func (c *conn) SetWriteDeadline(t time.Time) error { c.writeDL.set(t); return nil }

// deadline is a time after which a wait ends: passed's channel is closed from then on, until a
// later time is set.
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	done  chan struct{}
}

func newDeadline() deadline { return deadline{done: make(chan struct{})} }

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// set makes t the deadline (zero: none).
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.done // the timer fired: its function closed done, or is about to
	}
	d.timer = nil
	passed := isClosed(d.done)
	if t.IsZero() {
		if passed {
			d.done = make(chan struct{})
		}
		return
	}
	if wait := time.Until(t); wait > 0 {
		if passed {
			d.done = make(chan struct{})
		}
		done := d.done
		d.timer = time.AfterFunc(wait, func() { close(done) })
		return
	}
	if !passed {
		close(d.done)
	}
}

// stop drops the deadline's timer (the connection closed).
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.done // the timer fired: a later set must not close done again
	}
	d.timer = nil
}

// passed is a channel closed once the deadline passed.
func (d *deadline) passed() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.done
}
