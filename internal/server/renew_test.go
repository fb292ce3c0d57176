package server_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/agentlink"
	"bcd/internal/engine"
	bcdv1 "bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/server"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

var errNoCommands = errors.New("this test runs no commands")

// TestAgentCertificatesRenewed: against a real server whose site agent certificates live 3 s,
// a site agent renews its certificate through the gateway (an agent.cert.renew event), and once
// the certificate it joined with has expired, the agent restarted from its data dir is served
// with the renewed one.
func TestAgentCertificatesRenewed(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) { agentCertificatesRenewed(t, e) })
	}
}

func agentCertificatesRenewed(t *testing.T, e store.Engine) {
	srv, ctx := serve(t, server.Config{StoreDSN: storetest.DSN(t, e), Engine: engine.Config{SiteCertTTL: 3 * time.Second}}, testLog(t))
	st := srv.Service().Store()
	site, err := st.Site(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := srv.CreateSiteJoinToken(ctx, site.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cfg := agentlink.Config{
		GatewayURL: srv.GatewayURL(), CAPEM: srv.CAPEM(), DataDir: t.TempDir(), Kind: agentlink.KindSite, JoinToken: tok,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Logger: testLog(t),
	}
	none := agentlink.HandlerFunc(func(context.Context, agentlink.Command, func(agentlink.Progress)) ([]byte, error) {
		return nil, errNoCommands
	})
	lctx, cancel := context.WithCancel(ctx)
	l, err := agentlink.Dial(lctx, cfg, none)
	if err != nil {
		t.Fatal(err)
	}
	first, err := x509.ParseCertificate(l.CertDER())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the site agent's certificate renewed (it lives 3 s)", func() bool { return !bytes.Equal(l.CertDER(), first.Raw) })
	evs, err := st.Events(ctx, store.EventFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	renewals := 0
	for _, ev := range evs {
		if ev.Kind == "agent.cert.renew" && strings.Contains(ev.Data, l.Identity().URI()) {
			renewals++
		}
	}
	if renewals == 0 {
		t.Fatal("no agent.cert.renew event for the site agent")
	}
	// Doctor shows the site agent's certificate: the renewed one (or a later renewal).
	auth := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			r.Header().Set("Authorization", "Bearer "+srv.FirstAdminToken())
			return next(ctx, r)
		}
	}))
	doc, err := bcdv1connect.NewNodeServiceClient(http.DefaultClient, srv.URL(), auth).Doctor(ctx, connect.NewRequest(&bcdv1.DoctorRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if len(doc.Msg.SiteAgents) != 1 {
		t.Fatalf("doctor lists %d site agents", len(doc.Msg.SiteAgents))
	}
	a := doc.Msg.SiteAgents[0]
	expires, err := time.Parse(time.RFC3339Nano, a.CertExpires)
	if err != nil || !expires.After(first.NotAfter) || a.RenewalOverdue {
		t.Fatalf("doctor: certificate until %q (%v), overdue %v; the first expired %s", a.CertExpires, err, a.RenewalOverdue, first.NotAfter)
	}

	<-time.After(time.Until(first.NotAfter.Add(time.Second)))
	cancel()
	if err := l.Wait(); err != nil {
		t.Fatalf("link: %v", err)
	}
	lctx, cancel = context.WithCancel(ctx)
	defer cancel()
	l, err = agentlink.Dial(lctx, cfg, none)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(l.CertDER(), first.Raw) {
		t.Fatal("the restarted agent read the first certificate from its data dir")
	}
	if _, err := l.BootLease(ctx, agentlink.LeaseRequest{TTL: 5 * time.Second}); err != nil {
		t.Fatalf("a call of the restarted agent, past the first certificate's end: %v", err)
	}
	cancel()
	if err := l.Wait(); err != nil {
		t.Fatalf("link: %v", err)
	}
}
