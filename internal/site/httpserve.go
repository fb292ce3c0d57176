package site

import (
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Bounds of the boot HTTP server: anyone on the provisioning network reaches it.
const (
	// DefaultHTTPMaxConns bounds the connections open at once; Accept waits beyond.
	DefaultHTTPMaxConns = 1024
	// DefaultHTTPIdleTimeout closes a keep-alive connection idle that long.
	DefaultHTTPIdleTimeout = 60 * time.Second
	// DefaultHTTPBodyTimeout bounds the read of a request's body (a discovery report: at most
	// netboot.MaxDiscoveryReport bytes). Requests without a body (artifact downloads) have
	// none: their headers are bounded by httpHeaderTimeout.
	DefaultHTTPBodyTimeout = 30 * time.Second
	// DefaultHTTPWriteTimeout is how long one write of a response may wait for a client that
	// does not read; every write (a chunk of at most writeChunk bytes) starts it again, so a
	// download that makes progress never times out.
	DefaultHTTPWriteTimeout = 30 * time.Second
	httpHeaderTimeout       = 10 * time.Second
	httpShutdownTimeout     = 5 * time.Second
	// writeChunk is the most one write sends before the write deadline is moved on.
	writeChunk = 256 << 10
)

// limitListener accepts at most cap(sem) connections at once: Accept waits while that many are
// open (new connections wait in the kernel's backlog). Unlike x/net/netutil's, its connections
// of a TCP listener are still *net.TCPConn underneath with their ReadFrom, so artifact downloads
// keep using sendfile.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	release := sync.OnceFunc(func() { <-l.sem })
	if tc, ok := c.(*net.TCPConn); ok {
		return &limitedTCPConn{TCPConn: tc, release: release}, nil
	}
	return &limitedConn{Conn: c, release: release}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitedTCPConn struct {
	*net.TCPConn
	release func()
}

func (c *limitedTCPConn) Close() error {
	err := c.TCPConn.Close()
	c.release()
	return err
}

type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// withDeadlines bounds a request's body read (a request with a body must send it within body)
// and each write of its response (write, moved on with every chunk written).
func withDeadlines(next http.Handler, body, write time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.ContentLength != 0 { // a body, announced or chunked (-1)
			_ = rc.SetReadDeadline(time.Now().Add(body))
		}
		dw := &deadlineWriter{ResponseWriter: w, rc: rc, timeout: write}
		dw.extend() // also replaces the deadline an earlier request on the connection left
		next.ServeHTTP(dw, r)
	})
}

// deadlineWriter moves the connection's write deadline on before every write: a client that
// stops reading is dropped after timeout, one that reads is served however long it takes.
type deadlineWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

func (d *deadlineWriter) extend() { _ = d.rc.SetWriteDeadline(time.Now().Add(d.timeout)) }

// Unwrap lets http.ResponseController reach the connection's response.
func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }

func (d *deadlineWriter) Write(p []byte) (int, error) {
	var n int
	for len(p) > 0 {
		d.extend()
		k, err := d.ResponseWriter.Write(p[:min(len(p), writeChunk)])
		n += k
		if err != nil {
			return n, err
		}
		p = p[k:]
	}
	return n, nil
}

// ReadFrom sends r in chunks of writeChunk, each under a fresh deadline. A *io.LimitedReader
// (http.ServeContent's) is cut into LimitedReaders of the same reader, so that a file still
// goes out by sendfile.
func (d *deadlineWriter) ReadFrom(r io.Reader) (int64, error) {
	rf, ok := d.ResponseWriter.(io.ReaderFrom)
	if !ok {
		return io.Copy(struct{ io.Writer }{d}, r)
	}
	var total int64
	for {
		d.extend()
		var (
			n    int64
			want int64 = writeChunk
			err  error
		)
		if lr, ok := r.(*io.LimitedReader); ok {
			if lr.N <= 0 {
				return total, nil
			}
			want = min(lr.N, writeChunk)
			n, err = rf.ReadFrom(&io.LimitedReader{R: lr.R, N: want})
			lr.N -= n
		} else {
			n, err = rf.ReadFrom(io.LimitReader(r, writeChunk))
		}
		total += n
		if err != nil || n < want {
			return total, err // n < want: the reader ended
		}
	}
}
