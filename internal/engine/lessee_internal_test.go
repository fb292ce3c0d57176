package engine

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"bcd/internal/gateway"
	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// A connection whose recording fails (here: its context ends first) leaves no OS role behind:
// the gateway calls no Disconnected for a refused connection.
func TestRefusedOSConnectionForgotten(t *testing.T) {
	st := storetest.Open(t, store.SQLite)
	e := New(st, nil, slog.New(slog.DiscardHandler), Config{})
	g := e.Gateway()
	ref := gateway.AgentRef{Kind: pki.KindNodeTenant, NodeID: "n1", Generation: 1}
	for range 10 {
		h := g.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithCancel(r.Context())
			cancel()
			if err := g.Connected(ctx, ref, gateway.Hello{Capabilities: []string{RoleOS}}); err == nil {
				t.Error("a connection recorded under a cancelled context")
			}
		}))
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("POST", "/", nil))
	}
	e.sentMu.Lock()
	n := len(e.osConns)
	e.sentMu.Unlock()
	if n != 0 {
		t.Fatalf("%d OS roles left by 10 refused connections", n)
	}
}

// The BMC address a machine reports in-band is where the site agent sends the node's BMC
// credential: only a unicast address a BMC can have is taken (IPv4-mapped ones as IPv4).
func TestInbandAddressOnlyBMCAddresses(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"10.0.0.5", "10.0.0.5"},
		{"10.0.0.5:623", "10.0.0.5:623"},
		{"[2001:db8::5]:623", "[2001:db8::5]:623"},
		{"::ffff:10.0.0.5", "10.0.0.5"},
		{"[::ffff:10.0.0.5]:623", "10.0.0.5:623"},
		{"127.0.0.1", ""},
		{"127.0.0.1:8443", ""},
		{"::1", ""},
		{"169.254.169.254", ""},
		{"255.255.255.255", ""},
		{"::ffff:127.0.0.1", ""},
		{"[fe80::1]:623", ""},
		{"0.0.0.0", ""},
		{"224.0.0.1", ""},
		{"10.0.0.5:0", ""},
		{"bmc.example", ""},
	} {
		got, _, err := InbandAddress(`{"address":"` + tc.in + `"}`)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("InbandAddress(%s) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
