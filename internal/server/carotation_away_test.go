package server_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	"bcd/internal/agentlink"
	bcdv1 "bcd/internal/gen/bcdv1"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/pki"
	"bcd/internal/server"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
)

// TestAgentAwayThroughActivationReconnects: a site agent that joined before bcd ca rotate and
// was away (stopped, its data dir kept) through rotate and activate holds only the previous
// CA. Started again afterwards, on the other server of the installation (PostgreSQL: which
// picked the activation up from the store), it verifies the gateway through the new CA cross-signed by
// the previous one, is handed the new CA at its first heartbeat, stores it and renews with it;
// after finish it trusts the new CA alone and connects again, to either server.
func TestAgentAwayThroughActivationReconnects(t *testing.T) {
	for _, e := range storetest.Engines {
		t.Run(string(e), func(t *testing.T) { agentAwayThroughActivation(t, e) })
	}
}

func agentAwayThroughActivation(t *testing.T, e store.Engine) {
	dsn := storetest.DSN(t, e)
	seal := make([]byte, 32)
	if _, err := rand.Read(seal); err != nil {
		t.Fatal(err)
	}
	key := base64.StdEncoding.EncodeToString(seal)
	first, ctx := serve(t, server.Config{StoreDSN: dsn, Key: key, CARefresh: 50 * time.Millisecond}, testLog(t))
	second := first // an SQLite store serves one server
	if e == store.Postgres {
		second, _ = serve(t, server.Config{StoreDSN: dsn, Key: key, CARefresh: 50 * time.Millisecond}, testLog(t))
	}
	st := first.Service().Store()
	site, err := st.Site(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	none := agentlink.HandlerFunc(func(context.Context, agentlink.Command, func(agentlink.Progress)) ([]byte, error) {
		return nil, errNoCommands
	})
	oldCA := first.CAPEM()
	oldFP := pki.BundleFingerprints(oldCA)[0]
	dir := filepath.Join(t.TempDir(), "away")
	// run starts the agent from its data dir (joining the first time) against srv's gateway;
	// stop ends it and waits for it.
	run := func(srv *server.Server, tok string) (l *agentlink.Link, stop func()) {
		t.Helper()
		lctx, cancel := context.WithCancel(ctx)
		l, err := agentlink.Dial(lctx, agentlink.Config{
			GatewayURL: srv.GatewayURL(), CAPEM: oldCA, DataDir: dir, Kind: agentlink.KindSite, JoinToken: tok,
			MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, Logger: testLog(t),
		}, none)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		var stopped bool
		stop = func() {
			if !stopped {
				stopped = true
				cancel()
				_ = l.Wait()
			}
		}
		t.Cleanup(stop)
		return l, stop
	}
	connected := func(what string, want int) {
		t.Helper()
		waitFor(t, 10*time.Second, what, func() bool {
			agents, err := st.ConnectedAgentsCATrust(ctx)
			return err == nil && len(agents) == want
		})
	}
	caFile := func() []string {
		b, _ := os.ReadFile(filepath.Join(dir, agentlink.CAFile))
		return pki.BundleFingerprints(b)
	}
	issuer := func() string {
		b, err := os.ReadFile(filepath.Join(dir, agentlink.CertFile))
		if err != nil {
			return ""
		}
		der, err := pki.DecodeCertPEM(b)
		if err != nil {
			return ""
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return ""
		}
		return pki.IssuerInBundle(c, first.CAPEM())
	}

	tok, err := first.CreateSiteJoinToken(ctx, site.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, stop := run(first, tok)
	connected("the agent connected", 1)
	stop()
	connected("the agent gone", 0)
	if !slices.Equal(caFile(), []string{oldFP}) {
		t.Fatalf("the agent's CA file holds %v, want the first CA alone", caFile())
	}

	// Rotate and activate while it is away: nothing connected holds them back.
	auth := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, r connect.AnyRequest) (connect.AnyResponse, error) {
			r.Header().Set("Authorization", "Bearer "+first.FirstAdminToken())
			return next(ctx, r)
		}
	}))
	inv := bcdv1connect.NewInventoryServiceClient(http.DefaultClient, first.URL(), auth)
	rot, err := inv.RotateAgentCA(ctx, connect.NewRequest(&bcdv1.RotateAgentCARequest{Reason: "yearly"}))
	if err != nil {
		t.Fatal(err)
	}
	newFP := rot.Msg.Rotation.GetNext().GetSha256()
	act, err := inv.ActivateAgentCA(ctx, connect.NewRequest(&bcdv1.ActivateAgentCARequest{Reason: "yearly"}))
	if err != nil {
		t.Fatal(err)
	}
	if r := act.Msg.Rotation; r.Stage != pki.StageOverlap || r.GetActive().GetSha256() != newFP || r.GetPrevious().GetSha256() != oldFP {
		t.Fatalf("after activate: %v", r)
	}
	for _, srv := range []*server.Server{first, second} {
		waitFor(t, 10*time.Second, "both servers signing with the new CA", func() bool { return pki.BundleFingerprints(srv.CAPEM())[0] == newFP })
		if err := gatewayVerifies(ctx, srv, oldCA); err != nil {
			t.Fatalf("overlap: a client trusting only the previous CA does not verify the gateway at %s: %v", srv.GatewayURL(), err)
		}
	}

	// Back, on the other server: it connects, fetches the new CA and renews with it.
	l, stop := run(second, "")
	waitFor(t, 10*time.Second, "the agent storing the new CA", func() bool { return slices.Contains(caFile(), newFP) })
	waitFor(t, 10*time.Second, "the agent certified by the new CA", func() bool { return issuer() == newFP })
	callWorks(t, l, "a call of the agent back after the activation")

	// Finish: refused only while it still used its old certificate.
	waitFor(t, 10*time.Second, "finish accepted", func() bool {
		_, err := inv.FinishAgentCA(ctx, connect.NewRequest(&bcdv1.FinishAgentCARequest{Reason: "done"}))
		if connect.CodeOf(err) == connect.CodeFailedPrecondition {
			t.Logf("finish refused: %v", err)
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return true
	})
	waitFor(t, 10*time.Second, "the agent trusting the new CA alone", func() bool { return slices.Equal(caFile(), []string{newFP}) })
	stop()
	for _, srv := range []*server.Server{first, second} {
		waitFor(t, 10*time.Second, "both servers trusting the new CA alone", func() bool {
			return slices.Equal(pki.BundleFingerprints(srv.CAPEM()), []string{newFP})
		})
		if err := gatewayVerifies(ctx, srv, oldCA); err == nil {
			t.Fatalf("finished: a client trusting only the previous CA verifies the gateway at %s", srv.GatewayURL())
		}
		l, stop := run(srv, "")
		callWorks(t, l, "a call of the agent after finish")
		stop()
	}
}

// gatewayVerifies makes a TLS handshake with srv's gateway as an agent trusting caPEM (without
// a client certificate) and says whether it verified the gateway's certificate.
func gatewayVerifies(ctx context.Context, srv *server.Server, caPEM []byte) error {
	u, err := url.Parse(srv.GatewayURL())
	if err != nil {
		return err
	}
	cfg := pki.ClientTLSConfig(caPEM, tls.Certificate{})
	cfg.ServerName = u.Hostname()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return err
	}
	return conn.Close()
}
