package server_test

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"bcd/internal/server"
)

// closeHook is a client connection that says when it is closed.
type closeHook struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *closeHook) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// TestShutdownClosesHTTP2Connections: the API speaks HTTP/2 without TLS (gRPC clients); when
// the server stops, those connections end with it, as HTTP/1 ones do. A connection the
// server left open would keep serving requests on a closed store.
func TestShutdownClosesHTTP2Connections(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := server.New(ctx, server.Config{Listen: "127.0.0.1:0", GatewayListen: "off", DataDir: t.TempDir()}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()

	conns := make(chan *closeHook, 4)
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		h := &closeHook{Conn: c, closed: make(chan struct{})}
		conns <- h
		return h, nil
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(srv.URL() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("/healthz answered over %s, want HTTP/2", resp.Proto)
	}
	conn := <-conns

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("server: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not stop")
	}
	select {
	case <-conn.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the server stopped, and its HTTP/2 connection stays open")
	}
}
