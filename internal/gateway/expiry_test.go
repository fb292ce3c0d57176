package gateway_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"bcd/internal/agentlink"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/pki"
)

// shiftedClock is a gateway clock that a test moves.
type shiftedClock struct{ off atomic.Int64 }

func (c *shiftedClock) now() time.Time           { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *shiftedClock) set(d time.Duration)      { c.off.Store(int64(d)) }
func (c *shiftedClock) config() func() time.Time { return c.now }

// A connection keeps the certificate of its handshake. Once that certificate is past its end
// the gateway refuses every new call on the connection and ends its open stream at the next
// re-check, saying why in the refusal's metadata; an agent whose own certificate is still
// valid (as an agent that renewed since would be) keeps reconnecting instead of stopping, and
// is admitted again once the certificate is valid.
func TestExpiredCertificateOnOpenConnection(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	var clock shiftedClock
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 100 * time.Millisecond, RecheckInterval: 50 * time.Millisecond, Now: clock.config()})
	key, der := csr(t)
	certDER, err := env.CA.IssueSiteAgent(der, "s1", "a1", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.TLSCertificate(certDER, key)
	if err != nil {
		t.Fatal(err)
	}

	// A unary call on a connection whose certificate expired since its handshake.
	cl := rawClient(t, env, cert)
	ctx := context.Background()
	if _, err := cl.Renew(ctx, connect.NewRequest(&agentv1.RenewRequest{})); err != nil {
		t.Fatalf("renewing with a valid certificate: %v", err)
	}
	for _, tc := range []struct {
		name string
		off  time.Duration
		ok   bool
	}{
		{"past its end", 2 * time.Hour, false},
		{"before its start", -time.Hour, false},
		{"inside its window again", 0, true},
	} {
		clock.set(tc.off)
		_, err := cl.Renew(ctx, connect.NewRequest(&agentv1.RenewRequest{}))
		if tc.ok {
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			continue
		}
		var ce *connect.Error
		if !errors.As(err, &ce) || ce.Code() != connect.CodeUnauthenticated || ce.Meta().Get(pki.RefusalHeader) != pki.RefusalCertExpired {
			t.Fatalf("%s: %v, want unauthenticated with %s: %s", tc.name, err, pki.RefusalHeader, pki.RefusalCertExpired)
		}
	}

	// An open stream ends at the re-check once its certificate is past its end; the agent
	// keeps trying and is admitted when the certificate is valid again.
	lctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := linkConfig(env, writeIdentity(t, env, key, certDER))
	cfg.Kind = agentlink.KindSite
	l, err := agentlink.Dial(lctx, cfg, agentlink.HandlerFunc(nil))
	if err != nil {
		t.Fatal(err)
	}
	site := gateway.AgentRef{Kind: pki.KindSiteAgent, AgentID: "a1", SiteID: "s1"}
	open := func() int { return env.Queue.Counts().Open[gatewaytest.AgentKey(site)] }
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-lctx.Done():
				t.Fatalf("%s: not before the deadline", what)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	waitFor("the stream opens", func() bool { return open() == 1 })
	sessions := l.Sessions()
	clock.set(2 * time.Hour)
	waitFor("the stream ends", func() bool { return open() == 0 })
	waitFor("the agent tries again", func() bool { return l.Sessions() > sessions+1 })
	select {
	case <-waitDone(l):
		t.Fatalf("the link stopped: %v", l.Wait())
	default:
	}
	clock.set(0)
	waitFor("the stream opens again", func() bool { return open() == 1 })
	cancel()
	if err := l.Wait(); err != nil {
		t.Fatalf("link: %v", err)
	}
}

func waitDone(l *agentlink.Link) <-chan struct{} {
	done := make(chan struct{})
	go func() { _ = l.Wait(); close(done) }()
	return done
}
