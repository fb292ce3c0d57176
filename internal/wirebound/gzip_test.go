package wirebound

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// encodings records the Content-Encoding of the answers that pass through it.
type encodings struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string
}

func (e *encodings) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := e.next.RoundTrip(r)
	if err == nil {
		e.mu.Lock()
		e.seen = append(e.seen, resp.Header.Get("Content-Encoding"))
		e.mu.Unlock()
	}
	return resp, err
}

// A handler with Gzip(minBytes) answers a client that accepts gzip compressed from minBytes on,
// and as it is below.
func TestGzipFromMinBytesOn(t *testing.T) {
	const minBytes = 1 << 10
	mux := http.NewServeMux()
	mux.Handle("/test.Echo/Repeat", connect.NewUnaryHandler("/test.Echo/Repeat",
		func(_ context.Context, r *connect.Request[wrapperspb.Int64Value]) (*connect.Response[wrapperspb.StringValue], error) {
			return connect.NewResponse(wrapperspb.String(strings.Repeat("a", int(r.Msg.GetValue())))), nil
		}, Gzip(minBytes)))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	rec := &encodings{next: http.DefaultTransport}
	client := connect.NewClient[wrapperspb.Int64Value, wrapperspb.StringValue](&http.Client{Transport: rec}, srv.URL+"/test.Echo/Repeat")
	for _, tc := range []struct {
		size     int64
		encoding string
	}{
		{10, ""},
		{minBytes - 10, ""}, // (a string's tag and length add 3 bytes)
		{minBytes, "gzip"},
		{64 << 10, "gzip"},
	} {
		resp, err := client.CallUnary(context.Background(), connect.NewRequest(wrapperspb.Int64(tc.size)))
		if err != nil {
			t.Fatalf("%d bytes: %v", tc.size, err)
		}
		if got := len(resp.Msg.GetValue()); got != int(tc.size) {
			t.Errorf("%d bytes: answered %d", tc.size, got)
		}
		rec.mu.Lock()
		got := rec.seen[len(rec.seen)-1]
		rec.mu.Unlock()
		if got != tc.encoding {
			t.Errorf("%d bytes: Content-Encoding %q, want %q", tc.size, got, tc.encoding)
		}
	}
}
