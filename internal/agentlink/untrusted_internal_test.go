package agentlink

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// UntrustedGateway tells a gateway whose certificate the agent's CAs do not verify (the agent
// CA rotated while the agent was away) from other failures to reach it.
func TestUntrustedGateway(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: x509.NewCertPool()}}}
	_, untrusted := client.Get(srv.URL)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, refused := client.Get("https://" + addr)
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"certificate from another CA", untrusted, true},
		{"wrapped", fmt.Errorf("connecting: %w", untrusted), true},
		{"connection refused", refused, false},
		{"other", errors.New("stream reset"), false},
	} {
		if tc.err == nil {
			t.Fatalf("%s: no error to classify", tc.name)
		}
		if got := UntrustedGateway(tc.err); got != tc.want {
			t.Errorf("%s (%v): %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
