package memnet_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"bcd/internal/memnet"
	"bcd/internal/pki"
)

// TestConnBehavesAsANetConn runs x/net's conformance suite for net.Conn over a dialled pair:
// I/O in both directions, racing readers and writers, every kind of deadline, close.
func TestConnBehavesAsANetConn(t *testing.T) {
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		ln := memnet.Listen("conformance")
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}()
		c1, err = ln.DialContext(context.Background(), "tcp", "ignored:1")
		if err != nil {
			return nil, nil, nil, err
		}
		c2, ok := <-accepted
		if !ok {
			return nil, nil, nil, errors.New("accept failed")
		}
		return c1, c2, func() { c1.Close(); c2.Close(); ln.Close() }, nil
	})
}

func dialPair(t *testing.T, ln *memnet.Listener) (client, server net.Conn) {
	t.Helper()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	client, err := ln.DialContext(context.Background(), "tcp", "x:1")
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestListener(t *testing.T) {
	t.Run("each connection has its own client address, the listener's as the other", func(t *testing.T) {
		ln := memnet.Listen("gw")
		defer ln.Close()
		c1, s1 := dialPair(t, ln)
		c2, _ := dialPair(t, ln)
		if c1.LocalAddr().String() == c2.LocalAddr().String() {
			t.Errorf("two connections share the local address %s", c1.LocalAddr())
		}
		if c1.RemoteAddr().String() != "gw" || s1.LocalAddr().String() != "gw" || s1.RemoteAddr() != c1.LocalAddr() {
			t.Errorf("addresses: client %s→%s, server %s→%s", c1.LocalAddr(), c1.RemoteAddr(), s1.LocalAddr(), s1.RemoteAddr())
		}
		if c1.LocalAddr().Network() != "memnet" || ln.Addr().String() != "gw" {
			t.Errorf("network %q, listener address %q", c1.LocalAddr().Network(), ln.Addr())
		}
	})
	t.Run("closed: Accept and dials fail, connections made stay open", func(t *testing.T) {
		ln := memnet.Listen("gw")
		c, s := dialPair(t, ln)
		ln.Close()
		if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close = %v, want net.ErrClosed", err)
		}
		if _, err := ln.DialContext(context.Background(), "tcp", "x:1"); err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("dial after Close = %v, want refused", err)
		}
		go func() { _, _ = c.Write([]byte("still")) }()
		b := make([]byte, 5)
		if _, err := io.ReadFull(s, b); err != nil || string(b) != "still" {
			t.Errorf("read on a connection made before Close = %q, %v", b, err)
		}
	})
	t.Run("a dial nobody accepts ends with its context", func(t *testing.T) {
		ln := memnet.Listen("gw")
		defer ln.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if _, err := ln.DialContext(ctx, "tcp", "x:1"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("dial without Accept = %v, want the context's deadline", err)
		}
	})
}

func TestConnEnds(t *testing.T) {
	t.Run("the peer reads what was written before Close, then EOF", func(t *testing.T) {
		c, s := dialPair(t, memnet.Listen("gw"))
		if _, err := c.Write([]byte("last words")); err != nil {
			t.Fatal(err)
		}
		c.Close()
		got, err := io.ReadAll(s)
		if err != nil || string(got) != "last words" {
			t.Errorf("ReadAll = %q, %v", got, err)
		}
	})
	t.Run("a write to a peer that closed fails", func(t *testing.T) {
		c, s := dialPair(t, memnet.Listen("gw"))
		s.Close()
		if _, err := c.Write([]byte("x")); !errors.Is(err, io.ErrClosedPipe) {
			t.Errorf("Write = %v, want io.ErrClosedPipe", err)
		}
	})
	t.Run("a writer blocked on a full buffer is freed by the peer's close", func(t *testing.T) {
		c, s := dialPair(t, memnet.Listen("gw"))
		done := make(chan error, 1)
		go func() {
			_, err := c.Write(make([]byte, 1<<20)) // more than the buffer holds
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("a write past the buffer returned before the peer read: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		s.Close()
		select {
		case err := <-done:
			if !errors.Is(err, io.ErrClosedPipe) {
				t.Errorf("Write = %v, want io.ErrClosedPipe", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the blocked write did not end when the peer closed")
		}
	})
	t.Run("a deadline is a timeout error, and a later one lifts it", func(t *testing.T) {
		c, s := dialPair(t, memnet.Listen("gw"))
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() || !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read past its deadline = %v, want a timeout", err)
		}
		_ = c.SetReadDeadline(time.Time{})
		go func() { _, _ = s.Write([]byte("y")) }()
		b := make([]byte, 1)
		if _, err := c.Read(b); err != nil || b[0] != 'y' {
			t.Errorf("Read after the deadline was lifted = %q, %v", b, err)
		}
	})
}

// TestTLS13AndHTTP2 is what the package is for: an HTTP/2 server behind TLS 1.3, as the agent
// gateway is, and a client dialling it through the listener, several requests at once on one
// connection, each body several records and frames long.
func TestTLS13AndHTTP2(t *testing.T) {
	ca, err := pki.CreateCA("memnet test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	serverCert, err := pki.NewServerCert(ca, []string{"gateway.memnet"}, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln := memnet.Listen("gateway.memnet:443")
	cfg := serverCert.TLSConfig()
	cfg.NextProtos = []string{"h2"}
	cfg.MinVersion = tls.VersionTLS13
	var protos http.Protocols
	protos.SetHTTP2(true)
	srv := &http.Server{TLSConfig: cfg, Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		_, _ = w.Write(append([]byte(r.Proto+" "), bytes.ToUpper(body)...))
	})}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	defer func() {
		_ = srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve = %v", err)
		}
	}()

	tc := pki.ClientTLSConfig(ca.CertPEM(), tls.Certificate{})
	tc.ServerName = "gateway.memnet"
	tr := &http.Transport{DialContext: ln.DialContext, TLSClientConfig: tc, Protocols: &protos, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := strings.Repeat("abc", 20000+i) // several frames and records each way
			resp, err := client.Post("https://gateway.memnet/echo", "text/plain", strings.NewReader(body))
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if err != nil || string(got) != "HTTP/2.0 "+strings.ToUpper(body) {
				t.Errorf("request %d: %d bytes back (%v), want the upper-cased body over HTTP/2", i, len(got), err)
			}
			if resp.TLS == nil || resp.TLS.Version != tls.VersionTLS13 {
				t.Errorf("request %d: TLS %v, want 1.3", i, resp.TLS)
			}
		}()
	}
	wg.Wait()
}

// TestWritesDoNotInterleave: writes of several goroutines, each larger than the buffer, reach
// the reader whole, one after the other, as on a TCP connection.
func TestWritesDoNotInterleave(t *testing.T) {
	c, s := dialPair(t, memnet.Listen("gw"))
	const writers, size = 4, 600 << 10
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := c.Write(bytes.Repeat([]byte{byte('a' + i)}, size)); err != nil {
				t.Errorf("writer %d: %v", i, err)
			}
		}()
	}
	got := make([]byte, writers*size)
	if _, err := io.ReadFull(s, got); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := 0; i < len(got); i += size {
		run := got[i : i+size]
		if n := bytes.Count(run, run[:1]); n != size {
			t.Errorf("bytes %d to %d mix the writers' bytes (%d of %q)", i, i+size, n, run[:1])
		}
	}
}
