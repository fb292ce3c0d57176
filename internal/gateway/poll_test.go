package gateway_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	"bcd/internal/pki"
)

// A node's stream with nothing to take polls less and less often (an installed OS stays
// connected for as long as it runs), and its poll still finds what was queued without a
// signal (a notice lost): each wait between claims at least doubles up to the idle bound, and
// the command quietly queued arrives.
func TestIdleNodeStreamPollsLessOften(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	const poll, idle = 20 * time.Millisecond, 160 * time.Millisecond
	env := gatewaytest.Start(t, gateway.Config{PollInterval: poll, IdlePollInterval: idle, RecheckInterval: time.Hour})
	node := gateway.AgentRef{Kind: pki.KindNode, NodeID: "n1", Generation: 1}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := helloNode(t, ctx, env)
	// The stream's first claim, then six polls that find nothing: 20, 40, 80, 160, 160, 160 ms
	// apart (the first poll waits the base, each that found nothing doubles the next).
	for len(env.Queue.Claimed(node)) < 7 {
		select {
		case <-ctx.Done():
			t.Fatalf("%d claims before the deadline", len(env.Queue.Claimed(node)))
		case <-time.After(10 * time.Millisecond):
		}
	}
	at := env.Queue.Claimed(node)
	for i, want := 1, poll; i < 7; i, want = i+1, min(2*want, idle) {
		// Lower bounds only: a loaded machine makes the waits longer, never shorter.
		if got := at[i].Sub(at[i-1]); got < want*9/10 {
			t.Errorf("wait before poll %d: %s, want at least %s (claims at %v)", i, got, want, at)
		}
	}
	env.Queue.EnqueueQuietly(node, gateway.Command{ID: "quiet", Kind: "inventory.refresh", NodeID: "n1", Generation: 1, Args: []byte(`{}`)})
	for {
		m, err := s.Receive()
		if err != nil {
			t.Fatalf("the quietly queued command never arrived: %v", err)
		}
		if cs := commandsOf(m); len(cs) == 1 && cs[0].GetId() == "quiet" {
			break
		}
	}
	_ = s.CloseRequest()
}

// A gateway refuses an idle bound shorter than its poll.
func TestIdlePollIntervalNotUnderPoll(t *testing.T) {
	ca, err := pki.CreateCA("test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, err = gateway.New(gateway.Config{PollInterval: time.Second, IdlePollInterval: time.Millisecond,
		Queue: gatewaytest.NewQueue(), Identities: gatewaytest.NewIdentities(ca), CA: ca})
	if err == nil {
		t.Fatal("accepted an IdlePollInterval shorter than PollInterval")
	}
}
