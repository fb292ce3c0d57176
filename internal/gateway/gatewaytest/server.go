package gatewaytest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/pki"
)

// Env is a running gateway on 127.0.0.1 over TLS/HTTP/2 with the fakes behind it.
type Env struct {
	CA         *pki.CA
	Queue      *Queue
	Identities *Identities
	URL        string // https://127.0.0.1:port
	// Server is the gateway (its Stats count what it served).
	Server *gateway.Server
	ln     *trackingListener
}

// Start runs a gateway until the test ends. cfg's Queue, Identities and CA are filled in.
func Start(tb testing.TB, cfg gateway.Config) *Env {
	tb.Helper()
	return StartFor(tb, cfg)
}

// StartFor is Start with a server certificate valid for 127.0.0.1 and hosts too (names or
// addresses under which a VM reaches the forwarded listener).
func StartFor(tb testing.TB, cfg gateway.Config, hosts ...string) *Env {
	tb.Helper()
	ca, err := pki.CreateCA("bcd test CA", time.Now())
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := pki.NewServerCert(ca, append([]string{"127.0.0.1"}, hosts...), CertTTL, nil)
	if err != nil {
		tb.Fatal(err)
	}
	e := &Env{CA: ca, Queue: NewQueue(), Identities: NewIdentities(ca)}
	cfg.Queue, cfg.Identities, cfg.CA = e.Queue, e.Identities, ca
	srv, err := gateway.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	e.Server = srv
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	e.ln = &trackingListener{Listener: raw, conns: map[net.Conn]struct{}{}}
	e.URL = "https://" + raw.Addr().String()
	mux := http.NewServeMux()
	mux.Handle(srv.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, e.ln, cert, mux, cfg.Logger) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
			tb.Errorf("gateway: %v", err)
		}
	})
	return e
}

// Kill closes every connection the gateway accepted so far, as a network failure would.
func (e *Env) Kill() int { return e.ln.killAll() }

type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.conns[c] = struct{}{}
	l.mu.Unlock()
	return c, nil
}

func (l *trackingListener) killAll() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(l.conns)
	for c := range l.conns {
		_ = c.Close()
		delete(l.conns, c)
	}
	return n
}
