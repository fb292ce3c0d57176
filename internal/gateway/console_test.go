package gateway_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"bcd/internal/console"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/pki"
)

// A site agent's console stream relays both ways; the agent's last frame tells the operator why
// it ended; a certificate refused since (here: past its end) ends an open console stream at the
// next re-check, and the operator is told.
func TestConsoleStream(t *testing.T) {
	var clock shiftedClock
	hub := console.NewHub("")
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 100 * time.Millisecond, RecheckInterval: 50 * time.Millisecond, Now: clock.config(), Consoles: gatewaytest.HubConsoles(hub)})
	key, der := csr(t)
	certDER, err := env.CA.IssueSiteAgent(der, "s1", "a1", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.TLSCertificate(certDER, key)
	if err != nil {
		t.Fatal(err)
	}
	cl := rawClient(t, env, cert)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	open := func(id string) (*console.Session, func(data, end string) error, func() (*agentv1.ConsoleFrame, error)) {
		t.Helper()
		s, err := hub.Open(console.Info{ID: id, NodeID: "n1"})
		if err != nil {
			t.Fatal(err)
		}
		st := cl.Console(ctx)
		if err := st.Send(&agentv1.ConsoleFrame{CommandId: id, Data: []byte("hello ")}); err != nil {
			t.Fatal(err)
		}
		send := func(data, end string) error { return st.Send(&agentv1.ConsoleFrame{Data: []byte(data), End: end}) }
		return s, send, st.Receive
	}

	s, send, recv := open("c1")
	if err := send("world", ""); err != nil {
		t.Fatal(err)
	}
	var got string
	for got != "hello world" {
		b, err := s.Next(ctx)
		if err != nil {
			t.Fatalf("output %q: %v", got, err)
		}
		got += string(b)
	}
	if err := s.Input(ctx, []byte("ls\r")); err != nil {
		t.Fatal(err)
	}
	if f, err := recv(); err != nil || string(f.GetData()) != "ls\r" {
		t.Fatalf("input frame %v %v", f, err)
	}
	if err := send("", "another client took the console over"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(ctx); !errors.Is(err, console.ErrEnded) || !strings.Contains(err.Error(), "took the console over") {
		t.Fatalf("end: %v", err)
	}
	s.Close()

	s2, _, _ := open("c2")
	if b, err := s2.Next(ctx); err != nil || string(b) != "hello " {
		t.Fatalf("second session: %q %v", b, err)
	}
	clock.set(2 * time.Hour) // the certificate is past its end
	if _, err := s2.Next(ctx); !errors.Is(err, console.ErrEnded) || !strings.Contains(err.Error(), "refused now") {
		t.Fatalf("after the certificate's end: %v", err)
	}
}
