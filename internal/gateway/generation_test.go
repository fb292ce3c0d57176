package gateway_test

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/pki"
)

// A stream keeps the certificate of its handshake, and is admitted again only every
// RecheckInterval. A command made for a node's new identity generation (metal.revokeIdentity
// bumped it) must not go down a stream of the revoked one meanwhile: the stream ends at once,
// and the command waits, unfailed, for the node's new identity.
func TestNewGenerationsCommandNeverReachesTheRevokedStream(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	for _, tc := range []struct {
		name      string
		bumpTo    uint64 // 0: no bump
		delivered bool
	}{
		{"same generation: delivered", 0, true},
		{"generation bumped: refused", 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := gatewaytest.Start(t, gateway.Config{PollInterval: 50 * time.Millisecond, RecheckInterval: time.Hour})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			s := helloNode(t, ctx, env)
			if err := env.Queue.WaitFor(ctx, func(c gatewaytest.Counts) bool { return c.Open["node/n1"] == 1 }); err != nil {
				t.Fatal(err)
			}
			gen := uint64(1)
			if tc.bumpTo != 0 {
				gen = tc.bumpTo
				env.Identities.SetGeneration("n1", gen)
			}
			env.Queue.Enqueue(gateway.AgentRef{Kind: pki.KindNode, NodeID: "n1", Generation: gen},
				gateway.Command{ID: "wipe", Kind: "disk.wipe", NodeID: "n1", Generation: gen, Args: []byte(`{"mode":"quick"}`)})
			var got *agentv1.Command
			var err error
			for got == nil && err == nil {
				var m *agentv1.ServerMessage
				if m, err = s.Receive(); err == nil {
					if cs := commandsOf(m); len(cs) > 0 {
						got = cs[0]
					}
				}
			}
			_ = s.CloseRequest()
			switch {
			case tc.delivered && got == nil:
				t.Fatalf("the command was not delivered: %v", err)
			case !tc.delivered && got != nil:
				t.Fatalf("command %s of generation %d went down the stream of generation 1", got.GetId(), got.GetGeneration())
			case !tc.delivered && connect.CodeOf(err) != connect.CodePermissionDenied:
				t.Fatalf("stream ended with %v, want permission denied", err)
			}
			if e, _ := env.Queue.Get("wipe"); !tc.delivered && (e.State == gatewaytest.Failed || len(e.Updates) > 0) {
				t.Errorf("the command was reported on: %s %+v", e.State, e.Updates)
			}
		})
	}
}
