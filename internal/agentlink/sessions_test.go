package agentlink_test

import (
	"context"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
)

// Session kinds (an operator's console) run beside the command slots: with one slot and two
// sessions blocking, ordinary commands still run; without the kind listed, they wait.
func TestSessionsTakeNoSlot(t *testing.T) {
	for _, listed := range []bool{true, false} {
		env := start(t)
		cfg := siteConfig(t, env, t.TempDir())
		cfg.MaxConcurrent = 1
		if listed {
			cfg.Sessions = []string{"bmc.console"}
		}
		h := newCounter()
		ctx, cancel := context.WithCancel(context.Background())
		l := dial(t, ctx, cfg, h)
		// Two sessions that last until the agent stops ("block" ids run until their context ends).
		env.Queue.Enqueue(siteRef, gateway.Command{ID: "block-s1", Kind: "bmc.console", NodeID: "n1", Args: []byte(`{}`)},
			gateway.Command{ID: "block-s2", Kind: "bmc.console", NodeID: "n2", Args: []byte(`{}`)})
		// The commands come once a session was received: queued in the same frame, they could
		// be run first and leave nothing to show.
		actx, acancel := context.WithTimeout(context.Background(), 3*time.Second)
		if err := env.Queue.WaitFor(actx, func(c gatewaytest.Counts) bool { return c.Acks >= 1 }); err != nil {
			t.Fatalf("no session was acknowledged: %v", err)
		}
		acancel()
		cmds := commands("q", 5)
		env.Queue.Enqueue(siteRef, cmds...)
		wctx, wcancel := context.WithTimeout(context.Background(), 3*time.Second)
		err := env.Queue.WaitFor(wctx, func(c gatewaytest.Counts) bool { return c.Final >= len(cmds) })
		wcancel()
		switch {
		case listed && err != nil:
			t.Errorf("with sessions beside the slot: %v (%d final)", err, env.Queue.Counts().Final)
		case !listed && err == nil:
			t.Error("without sessions listed, commands ran while two blocking ones held the only slot")
		}
		stop(t, cancel, l)
	}
}
