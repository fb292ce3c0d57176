package agentlink

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/pki"
)

// A command leaves l.running only once its final update is in the journal. Drain returns when
// nothing runs and no final update is unconfirmed: a command seen in neither (no longer
// running, its result not yet recorded) made it return before the last result was even
// journaled, let alone sent (TestDrain failed so, about one run in 300). The test holds the
// journal's lock while the handler returns, so that the result cannot be recorded, and looks at
// l.running once the command's goroutine waits in journal.finish.
func TestCommandLeavesRunningAfterItsResultIsJournaled(t *testing.T) {
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 200 * time.Millisecond})
	ref := gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: "s1", AgentID: "a1"}
	started, release := make(chan struct{}), make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, _ Command, _ func(Progress)) ([]byte, error) {
		close(started)
		select {
		case <-release:
			return []byte(`{}`), nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := Dial(ctx, siteLinkConfig(t, env, ref), h)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		if err := l.Wait(); err != nil {
			t.Errorf("link: %v", err)
		}
	}()
	env.Queue.Enqueue(ref, gateway.Command{ID: "c1", Kind: "bmc.power", NodeID: "n1"})
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the command did not start")
	}

	l.j.mu.Lock() // the result cannot be journaled until the check below is done
	close(release)
	inFinish := false
	for deadline := time.Now().Add(30 * time.Second); !inFinish && time.Now().Before(deadline); {
		inFinish = goroutineIn("agentlink.(*journal).finish(")
		if !inFinish {
			time.Sleep(time.Millisecond) // poll: the goroutine gives no signal as it blocks
		}
	}
	l.mu.Lock()
	_, running := l.running["c1"]
	l.mu.Unlock()
	l.j.mu.Unlock()
	switch {
	case !inFinish:
		t.Fatal("the command's goroutine never reached journal.finish")
	case !running:
		t.Fatal("c1 left l.running before its result was journaled: Drain may return with it neither running nor unconfirmed")
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer dcancel()
	if err := l.Drain(dctx); err != nil {
		t.Fatal(err)
	}
	if e, _ := env.Queue.Get("c1"); e.State != gatewaytest.Succeeded {
		t.Fatalf("c1 is %s when Drain returned, want succeeded", e.State)
	}
}

// goroutineIn says whether a goroutine's stack holds a call of fn (package-qualified).
func goroutineIn(fn string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Contains(buf[:n], []byte(fn))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// siteLinkConfig is the Config of a site agent ref joining env's gateway, with a fresh data
// dir and quick reconnects.
func siteLinkConfig(t *testing.T, env *gatewaytest.Env, ref gateway.AgentRef) Config {
	return Config{
		GatewayURL: env.URL, CAPEM: env.CA.CertPEM(), DataDir: t.TempDir(), Kind: KindSite,
		JoinToken:  env.Identities.SiteToken(ref.SiteID, ref.AgentID, time.Hour),
		MinBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, HeartbeatInterval: time.Second,
	}
}
