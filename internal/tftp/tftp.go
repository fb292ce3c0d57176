// Package tftp is the site's read-only TFTP server: it hands iPXE binaries to firmware that
// network-boots over PXE. Requests go through an ordered chain of routes; the first route that
// handles a file name serves it, and "not found" is answered when none does. Writes are refused.
package tftp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pintftp "github.com/pin/tftp/v3"

	"bcd/internal/lograte"
)

// Route serves the file names it knows. handled=false passes the request to the next route.
type Route interface {
	TryServe(ctx context.Context, filename string, w io.ReaderFrom) (handled bool, err error)
}

// errNotFound is returned when no route handled a name.
var errNotFound = errors.New("file not found")

const maxNameLen = 255

// CleanName validates a requested file name and returns it in canonical form. Absolute paths,
// "..", backslashes, NUL and control bytes are refused; "./" and duplicate slashes are folded.
func CleanName(name string) (string, error) {
	if name == "" || len(name) > maxNameLen {
		return "", fmt.Errorf("file name must be 1..%d bytes", maxNameLen)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return "", fmt.Errorf("file name has a forbidden byte at offset %d", i)
		}
	}
	if strings.HasPrefix(name, "/") {
		return "", errors.New("absolute file names are refused")
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", errors.New("file names with .. are refused")
		}
	}
	clean := path.Clean(name)
	if clean == "." || !fs.ValidPath(clean) {
		return "", errors.New("file name is not a valid relative path")
	}
	return clean, nil
}

// DirRoute serves regular files below a directory (e.g. /usr/lib/ipxe), read-only, through an
// os.Root so that symlinks cannot lead outside it either.
type DirRoute struct {
	root *os.Root
}

// NewDirRoute opens dir.
func NewDirRoute(dir string) (*DirRoute, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("tftp: opening %s: %w", dir, err)
	}
	return &DirRoute{root: root}, nil
}

// Close releases the directory.
func (d *DirRoute) Close() error { return d.root.Close() }

// Has reports whether name would be served (contract tests use it).
func (d *DirRoute) Has(name string) bool {
	clean, err := CleanName(name)
	if err != nil {
		return false
	}
	fi, err := d.root.Stat(clean)
	return err == nil && fi.Mode().IsRegular()
}

// TryServe serves name when it is a regular file of the directory.
func (d *DirRoute) TryServe(ctx context.Context, name string, w io.ReaderFrom) (bool, error) {
	clean, err := CleanName(name)
	if err != nil {
		return false, nil
	}
	f, err := d.root.Open(clean)
	if err != nil {
		return false, nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return false, nil
	}
	if t, ok := w.(pintftp.OutgoingTransfer); ok {
		t.SetSize(fi.Size())
	}
	if _, err := w.ReadFrom(f); err != nil {
		return true, fmt.Errorf("sending %s: %w", clean, err)
	}
	return true, nil
}

// Transfer bounds: each transfer holds a UDP socket, a goroutine and an open file for as long
// as its client acknowledges (or for the whole retransmit schedule when it does not).
const (
	DefaultMaxTransfers  = 256
	DefaultMaxPerClient  = 8
	errBusyMessage       = "server busy: too many transfers in progress, retry later"
	errClientBusyMessage = "too many transfers in progress from this address, retry later"
)

// Config configures a TFTP server.
type Config struct {
	Routes  []Route        // tried in order
	Conn    net.PacketConn // the listening socket (udp :69 in production, 127.0.0.1:0 in tests)
	Timeout time.Duration  // per-packet retransmit timeout; 0: 2 s
	Retries int            // 0: 5
	// MaxTransfers bounds the transfers in progress; MaxPerClient those from one IP address. A
	// read request beyond either is answered with a TFTP error (the firmware retries). 0: the
	// defaults.
	MaxTransfers int
	MaxPerClient int
	// Counters, when set, count what the server does (a Prometheus collector reads them); nil:
	// the server keeps its own.
	Counters *Counters
	Logger   *slog.Logger
}

// Failure is why a read request was not served whole.
type Failure uint8

const (
	FailNotFound Failure = iota // no route serves the name
	FailBadName                 // the name is refused (absolute, "..", control bytes…)
	FailBusy                    // refused for a bound (transfers in progress)
	FailTransfer                // the transfer failed (the client stopped acknowledging, a read error)
	NumFailures
)

// String is the failure's label.
func (f Failure) String() string {
	return [...]string{"not_found", "bad_name", "busy", "transfer"}[f]
}

// Counters count the server's read requests: files served whole, the bytes of file data sent
// (those of failed transfers too), and the requests not served whole, by Failure.
type Counters struct {
	Served atomic.Uint64
	Bytes  atomic.Uint64
	Failed [NumFailures]atomic.Uint64
}

// Server is a read-only TFTP server.
type Server struct {
	routes       []Route
	conn         net.PacketConn
	log          *slog.Logger
	timeout      time.Duration
	retries      int
	maxTransfers int
	maxPerClient int
	counters     *Counters

	mu       sync.Mutex
	active   int
	byClient map[netip.Addr]int
	peak     int       // most transfers in progress at once (tests)
	refused  int       // requests refused for a bound
	warned   time.Time // last warning about refusals (at most one every refusalWarnEvery)
	// Requests for names no route serves, and names refused as malformed: logged at most once
	// every refusalWarnEvery each, with how many were held back since the last line.
	quiet *lograte.Limiter
}

// refusalWarnEvery spaces the warnings about refused requests (a flood would flood the log).
const refusalWarnEvery = 10 * time.Second

// New checks the configuration and builds a server.
func New(cfg Config) (*Server, error) {
	if len(cfg.Routes) == 0 {
		return nil, errors.New("tftp: no routes configured")
	}
	if cfg.Conn == nil {
		return nil, errors.New("tftp: no listening socket")
	}
	s := &Server{routes: cfg.Routes, conn: cfg.Conn, log: cfg.Logger, timeout: cfg.Timeout, retries: cfg.Retries,
		maxTransfers: cfg.MaxTransfers, maxPerClient: cfg.MaxPerClient, byClient: map[netip.Addr]int{},
		counters: cfg.Counters, quiet: lograte.New(refusalWarnEvery, 2)}
	if s.counters == nil {
		s.counters = &Counters{}
	}
	if s.maxTransfers <= 0 {
		s.maxTransfers = DefaultMaxTransfers
	}
	if s.maxPerClient <= 0 {
		s.maxPerClient = DefaultMaxPerClient
	}
	if s.timeout <= 0 {
		s.timeout = 2 * time.Second
	}
	if s.retries <= 0 {
		s.retries = 5
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

// Serve answers read requests until ctx ends, then waits for transfers in flight.
//
// pin/tftp opens each request's UDP socket (the server's TID) in its read loop, before the read
// handler runs: a refused request (a bound, a name no route serves, a write) is answered from a
// new port, as RFC 1350 allows, and that socket is closed at once. Answering from the listening
// socket is not possible with pin/tftp v3.2.0 without worse: its single-port mode panics (send
// on a closed channel) when a client repeats a request from one port while the previous one is
// being refused, and screening requests through a net.PacketConn wrapper hides the
// *net.UDPConn it needs for IP_PKTINFO (transfers would leave from the address the kernel
// picks rather than the one the client asked, with blksize capped at 512).
func (s *Server) Serve(ctx context.Context) error {
	srv := pintftp.NewServer(func(name string, rf io.ReaderFrom) error {
		return s.read(ctx, name, rf)
	}, nil) // nil write handler: pin/tftp answers every write request with an error
	srv.SetTimeout(s.timeout)
	srv.SetRetries(s.retries)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(s.conn) }()
	select {
	case <-ctx.Done():
		srv.Shutdown()
		<-done
		return nil
	case err := <-done:
		return fmt.Errorf("tftp: serving: %w", err)
	}
}

// acquire takes a transfer slot for a client. Refused (a bound reached), it returns the error
// to answer, whether to warn now, and the refusals so far.
func (s *Server) acquire(client netip.Addr) (warn bool, refused int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.byClient[client] >= s.maxPerClient:
		err = errors.New(errClientBusyMessage)
	case s.active >= s.maxTransfers:
		err = errBusy
	default:
		s.active++
		s.byClient[client]++
		s.peak = max(s.peak, s.active)
		return false, 0, nil
	}
	s.refused++
	if now := time.Now(); now.Sub(s.warned) >= refusalWarnEvery {
		s.warned, warn = now, true
	}
	return warn, s.refused, err
}

func (s *Server) release(client netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	if s.byClient[client]--; s.byClient[client] <= 0 {
		delete(s.byClient, client)
	}
}

// errBusy is what a refused read request is answered (pin/tftp sends it as a TFTP error).
var errBusy = errors.New(errBusyMessage)

func (s *Server) read(ctx context.Context, name string, rf io.ReaderFrom) error {
	remote := ""
	var client netip.Addr
	if t, ok := rf.(pintftp.OutgoingTransfer); ok {
		addr := t.RemoteAddr()
		remote = addr.String()
		if a, ok := netip.AddrFromSlice(addr.IP); ok {
			client = a.Unmap()
		}
	}
	if warn, refused, err := s.acquire(client); err != nil {
		s.counters.Failed[FailBusy].Add(1)
		// Answered at once: the socket pin/tftp opened for the transfer is closed with the error.
		if warn {
			s.log.WarnContext(ctx, "tftp read requests refused", "reason", err.Error(), "remote", remote,
				"max_transfers", s.maxTransfers, "max_per_client", s.maxPerClient, "refused_so_far", refused)
		}
		return err
	}
	defer s.release(client)
	cw := counting(rf)
	err := Dispatch(ctx, s.routes, name, cw)
	s.counters.Bytes.Add(uint64(cw.sent()))
	switch {
	case errors.Is(err, errNotFound):
		s.counters.Failed[FailNotFound].Add(1)
		s.quiet.Log(ctx, s.log, slog.LevelInfo, time.Now(), "not found", "tftp file not found", "remote", remote, "name_len", len(name))
	case errors.Is(err, errBadName):
		s.counters.Failed[FailBadName].Add(1)
		s.quiet.Log(ctx, s.log, slog.LevelWarn, time.Now(), "bad name", "tftp requested name refused", "remote", remote, "err", err)
	case err != nil:
		s.counters.Failed[FailTransfer].Add(1)
		s.log.WarnContext(ctx, "tftp transfer failed", "remote", remote, "err", err)
	default:
		s.counters.Served.Add(1)
		s.log.InfoContext(ctx, "tftp file served", "remote", remote, "name", name)
	}
	return err
}

// Counters returns the live counters.
func (s *Server) Counters() *Counters { return s.counters }

// countingWriter is a transfer that counts the bytes its ReadFrom sent; one of pin/tftp's
// outgoing transfers stays one (DirRoute sets its size).
type countingWriter interface {
	io.ReaderFrom
	sent() int64
}

type countedFrom struct {
	io.ReaderFrom
	n int64
}

func (c *countedFrom) ReadFrom(r io.Reader) (int64, error) {
	n, err := c.ReaderFrom.ReadFrom(r)
	c.n += n
	return n, err
}

func (c *countedFrom) sent() int64 { return c.n }

type countedTransfer struct {
	pintftp.OutgoingTransfer
	countedFrom
}

func (c *countedTransfer) ReadFrom(r io.Reader) (int64, error) { return c.countedFrom.ReadFrom(r) }

func counting(rf io.ReaderFrom) countingWriter {
	if t, ok := rf.(pintftp.OutgoingTransfer); ok {
		return &countedTransfer{OutgoingTransfer: t, countedFrom: countedFrom{ReaderFrom: rf}}
	}
	return &countedFrom{ReaderFrom: rf}
}

// errBadName wraps what CleanName refuses in a request.
var errBadName = errors.New("refusing requested name")

// Dispatch runs the route chain for name: the first route that handles it wins.
func Dispatch(ctx context.Context, routes []Route, name string, w io.ReaderFrom) error {
	if _, err := CleanName(name); err != nil {
		return fmt.Errorf("%w: %w", errBadName, err)
	}
	for _, r := range routes {
		handled, err := r.TryServe(ctx, name, w)
		if handled {
			return err
		}
	}
	return errNotFound
}
