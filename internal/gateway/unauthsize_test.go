package gateway_test

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/gen/agentv1/agentv1connect"
)

// countingZeros is an endless request body (up to limit bytes) that counts what was read of it.
type countingZeros struct {
	n     atomic.Int64
	limit int64
}

func (z *countingZeros) Read(p []byte) (int, error) {
	left := z.limit - z.n.Load()
	if left <= 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), left)]
	clear(p)
	z.n.Add(int64(len(p)))
	return len(p), nil
}

// Only Join is for callers without a client certificate; every other call is refused to them.
// Their requests must be held to a join's size too: read up to the agents' 16 MiB before the
// refusal, anyone who reaches the gateway could make it hold 16 MiB per request (256 requests
// per connection).
func TestUnauthenticatedRequestsBounded(t *testing.T) {
	env := start(t)
	client := httpClient(t, env, tls.Certificate{})
	const limit = 32 << 20
	for _, proc := range []string{
		agentv1connect.GatewayServiceRenewProcedure,
		agentv1connect.GatewayServiceBootLeaseProcedure,
		agentv1connect.GatewayServicePollSetProcedure,
		agentv1connect.GatewayServiceReportPowerProcedure,
		agentv1connect.GatewayServiceJoinProcedure,
	} {
		t.Run(proc, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			body := &countingZeros{limit: limit}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, env.URL+proc, body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/proto")
			resp, err := client.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					t.Fatalf("status %s", resp.Status)
				}
			}
			// What the client could write is the join bound plus HTTP/2 flow-control windows and
			// the transport's buffers (a few MiB), never the 16 MiB of an agent's message.
			if n := body.n.Load(); n > 8<<20 {
				t.Errorf("the gateway took %d bytes of a request without a client certificate (join bound %d)", n, gateway.MaxJoinBytes)
			}
		})
	}
}
