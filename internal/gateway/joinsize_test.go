package gateway_test

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/gateway"
	agentv1 "bcd/internal/gen/agentv1"
)

// Join needs no client certificate, so its request is bounded by MaxJoinBytes, not by the
// 16 MiB of an agent's stream: a larger one is refused before the token is looked at.
func TestJoinRequestBounded(t *testing.T) {
	env := start(t)
	c := rawClient(t, env, tls.Certificate{}) // no client certificate at all
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, der := csr(t)
	for _, tc := range []struct {
		name  string
		token string
		want  connect.Code
	}{
		{"oversized", "bcdj_" + strings.Repeat("a", 2*gateway.MaxJoinBytes), connect.CodeResourceExhausted},
		{"join-sized, unknown token", "bcdj_" + strings.Repeat("a", 40), connect.CodeUnauthenticated},
	} {
		_, err := c.Join(ctx, connect.NewRequest(&agentv1.JoinRequest{Kind: agentv1.AgentKind_AGENT_KIND_SITE, Token: tc.token, CsrDer: der}))
		if got := connect.CodeOf(err); got != tc.want {
			t.Errorf("%s join (%d bytes of token): %v (%v), want %v", tc.name, len(tc.token), got, err, tc.want)
		}
	}
}
