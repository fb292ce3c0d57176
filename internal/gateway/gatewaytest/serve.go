package gatewaytest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/pki"
)

// Serve serves h at pattern over the gateway's TLS on loopback, with a server certificate of
// ca for 127.0.0.1, until the test ends; it returns the gateway's URL.
func Serve(t testing.TB, ca *pki.CA, pattern string, h http.Handler) string {
	t.Helper()
	cert, err := pki.NewServerCert(ca, []string{"127.0.0.1"}, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle(pattern, h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gateway.ServeTLS(ctx, ln, cert, mux, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("gateway: %v", err)
		}
	})
	return "https://" + ln.Addr().String()
}
