package agentlink_test

import (
	"context"
	"testing"
	"time"
)

// A link that ended holds no connection to the gateway: its stream's connection, still busy a
// moment after the stream was cancelled, is closed with it rather than left to the transport's
// idle timeout (two minutes, during which an agent restarted in the same process would hold
// both lives' connections).
func TestLinkThatEndedHoldsNoConnection(t *testing.T) {
	env := start(t)
	h := newCounter()
	cmds := commands("c", 3)
	env.Queue.Enqueue(siteRef, cmds...)
	for i := range 3 {
		ctx, cancel := context.WithCancel(context.Background())
		l := dial(t, ctx, siteConfig(t, env, t.TempDir()), h)
		if i == 0 {
			waitFinal(t, env.Queue, len(cmds))
		}
		deadline := time.Now().Add(10 * time.Second)
		for l.OpenConns() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("life %d: the link never connected", i)
			}
			time.Sleep(5 * time.Millisecond)
		}
		stop(t, cancel, l)
		if n := l.OpenConns(); n != 0 {
			t.Fatalf("life %d: %d connections open after the link ended, want 0", i, n)
		}
	}
	checkOnce(t, env.Queue, h, cmds)
}
