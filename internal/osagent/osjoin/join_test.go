package osjoin

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/pki"
)

type testGateway struct {
	url string
	ca  *pki.CA
	ids *gatewaytest.Identities
	q   *gatewaytest.Queue
}

// startGateway runs a gateway on loopback until the test ends; onConnect, when set, is the
// queue's Connected hook (recording the connection).
func startGateway(t *testing.T, onConnect func(gateway.Hello) error) testGateway {
	t.Helper()
	ca, err := pki.CreateCA("bcd test CA", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ids, q := gatewaytest.NewIdentities(ca), gatewaytest.NewQueue()
	q.OnConnect = onConnect
	srv, err := gateway.New(gateway.Config{Queue: q, Identities: ids, CA: ca, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	path, h := srv.Handler()
	return testGateway{url: gatewaytest.Serve(t, ca, path, h), ca: ca, ids: ids, q: q}
}

func (g testGateway) metadata(token string) Metadata {
	return Metadata{NodeID: "n1", Gateway: g.url, InstanceToken: token, CA: string(g.ca.CertPEM())}
}

func fastJoiner(log *slog.Logger) *Joiner {
	return NewJoiner(JoinerConfig{Heartbeat: 50 * time.Millisecond, Linger: 50 * time.Millisecond, Timeout: 5 * time.Second, Logger: log})
}

// Join returns only once the gateway recorded the connection (its Connected returned), with
// the capability engine.RoleOS; a second Join of the token does nothing; the token is never
// logged.
func TestJoinHoldsUntilRecorded(t *testing.T) {
	arrived := make(chan struct{}, 16)
	release := make(chan struct{})
	g := startGateway(t, func(gateway.Hello) error {
		arrived <- struct{}{}
		<-release // the store write recording the connection, slow
		return nil
	})
	token := g.ids.InstanceToken("n1", time.Hour)
	var logs strings.Builder
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	j := fastJoiner(log)
	done := make(chan error, 1)
	go func() { done <- j.Join(context.Background(), g.metadata(token)) }()
	// Held in Connected, the first stream gets no answer: the agent ends it as silent and
	// opens another, which waits too. Join has not returned meanwhile.
	for n := 0; n < 2; {
		select {
		case <-arrived:
			n++
		case err := <-done:
			t.Fatalf("Join returned (%v) before the connection was recorded", err)
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c := g.q.Counts()
	if len(c.Hellos) == 0 || !slices.Contains(c.Hellos[len(c.Hellos)-1].Capabilities, engine.RoleOS) {
		t.Fatalf("hellos %+v lack %s", c.Hellos, engine.RoleOS)
	}
	connected := c.Connected
	if err := j.Join(context.Background(), g.metadata(token)); err != nil {
		t.Fatalf("second Join: %v", err)
	}
	if again := g.q.Counts().Connected; !maps.Equal(again, connected) {
		t.Fatalf("second Join connected again: %v, was %v", again, connected)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(logs.String(), token) {
		t.Fatalf("the token is in the log:\n%s", logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// What Join answers when it cannot join or cannot get the connection recorded; the error
// never holds the token.
func TestJoinFailures(t *testing.T) {
	refuseConnect := func(gateway.Hello) error { return errors.New("the store is down") }
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedURL := "https://" + closed.Addr().String()
	closed.Close()
	for _, tc := range []struct {
		name      string
		onConnect func(gateway.Hello) error
		md        func(g testGateway) Metadata
		want      error
	}{
		{"spent token", nil, func(g testGateway) Metadata {
			tok := g.ids.InstanceToken("n1", time.Hour)
			if _, err := g.ids.JoinNode(context.Background(), tok, csr(t), gateway.NodeHints{}); err != nil {
				t.Fatal(err)
			}
			return g.metadata(tok)
		}, ErrSpent},
		{"unknown token", nil, func(g testGateway) Metadata { return g.metadata("bcdi_unknownTokenAbCdEf0123") }, ErrSpent},
		{"gateway unreachable", nil, func(g testGateway) Metadata {
			md := g.metadata(g.ids.InstanceToken("n1", time.Hour))
			md.Gateway = closedURL
			return md
		}, ErrUnreachable},
		{"connection never recorded", refuseConnect, func(g testGateway) Metadata { return g.metadata(g.ids.InstanceToken("n1", time.Hour)) }, ErrUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := startGateway(t, tc.onConnect)
			md := tc.md(g)
			j := NewJoiner(JoinerConfig{Heartbeat: 50 * time.Millisecond, Linger: 50 * time.Millisecond, Timeout: time.Second})
			err := j.Join(context.Background(), md)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if strings.Contains(err.Error(), md.InstanceToken) {
				t.Fatalf("the error holds the token: %v", err)
			}
		})
	}
}

func csr(t *testing.T) []byte {
	t.Helper()
	_, der, err := pki.NewKeyAndCSR("other")
	if err != nil {
		t.Fatal(err)
	}
	return der
}
