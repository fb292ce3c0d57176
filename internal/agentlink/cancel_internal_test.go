package agentlink

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/pki"
)

// The gateway sends Cancel for a command once its ack is recorded, and the answer to that ack
// (AckResult) on the same stream: the Cancel may arrive first. A command cancelled so must not
// start when the answer comes (an aborted workflow's disk.wipe would run anyway).
func TestCancelBeforeTheAckIsAnswered(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cancel    bool
		wantState string
		wantRuns  int32
	}{
		{"not cancelled: runs", false, gatewaytest.Succeeded, 1},
		{"cancelled before the answer: never runs", true, gatewaytest.Failed, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := gatewaytest.Start(t, gateway.Config{PollInterval: 50 * time.Millisecond})
			ref := gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: "s1", AgentID: "a1"}
			acking, release := make(chan struct{}), make(chan struct{})
			var once, releaseOnce sync.Once
			unblock := func() { releaseOnce.Do(func() { close(release) }) }
			defer unblock()
			env.Queue.OnAck = func(id string) error {
				if id == "c1" {
					once.Do(func() { close(acking) })
					<-release
				}
				return nil
			}
			var runs atomic.Int32
			h := HandlerFunc(func(context.Context, Command, func(Progress)) ([]byte, error) {
				runs.Add(1)
				return []byte(`{}`), nil
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			l, err := Dial(ctx, siteLinkConfig(t, env, ref), h)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				unblock()
				cancel()
				if err := l.Wait(); err != nil {
					t.Errorf("link: %v", err)
				}
			}()
			env.Queue.Enqueue(ref, gateway.Command{ID: "c1", Kind: "disk.wipe", NodeID: "n1"})
			select {
			case <-acking: // journaled, acknowledged, its answer held back
			case <-time.After(30 * time.Second):
				t.Fatal("c1 was never acknowledged")
			}
			if tc.cancel {
				// The frame the gateway sends when Cancels lists c1 before the answer is out.
				if err := l.handle(&agentv1.ServerMessage{Msg: &agentv1.ServerMessage_Cancel{Cancel: &agentv1.Cancel{CommandId: "c1"}}}); err != nil {
					t.Fatal(err)
				}
			}
			unblock()
			wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer wcancel()
			if err := env.Queue.WaitFor(wctx, func(c gatewaytest.Counts) bool { return c.Final == 1 }); err != nil {
				t.Fatal(err)
			}
			e, _ := env.Queue.Get("c1")
			if e.State != tc.wantState || runs.Load() != tc.wantRuns {
				t.Fatalf("c1 is %s after %d runs (%q), want %s after %d", e.State, runs.Load(), e.Final.Error, tc.wantState, tc.wantRuns)
			}
			if tc.cancel && !strings.Contains(e.Final.Error, "not started") {
				t.Errorf("error %q does not say c1 never started", e.Final.Error)
			}
		})
	}
}
