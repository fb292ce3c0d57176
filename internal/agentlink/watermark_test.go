package agentlink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"bcd/internal/agentlink"
	"bcd/internal/gateway"
	"bcd/internal/gateway/gatewaytest"
)

// watermarkHeartbeat is the heartbeat interval of the watermark tests: the gateway's watermark
// rides on its heartbeat answers, so a short one keeps the tests quick; but a connection (the
// join's too) is dead after three silent intervals, and with 20 ms a loaded 2-core machine
// under -race cut joins ("http2: client connection lost") and streams in about one test in ten.
const watermarkHeartbeat = 250 * time.Millisecond

// An agent keeps the newest store watermark the gateway's heartbeat answers carry, in its data
// dir too, and names it in the Hello of every stream, also after a restart: it is the witness of
// how far the store had come, should the store be restored from an older backup.
func TestAgentKeepsStoreWatermark(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	var beats atomic.Int64
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 100 * time.Millisecond, Logger: testLogger(t),
		Watermark: func() (gateway.Watermark, bool) {
			b := beats.Load()
			return gateway.Watermark{StoreID: "store-1", Fences: 1, Beats: b}, b > 0
		}})
	// A control plane that finds the store behind the agent's watermark refuses the stream; the
	// agent keeps trying (the operator's fence lets it in) rather than stopping.
	var behind, refusals atomic.Int64
	env.Queue.OnConnect = func(h gateway.Hello) error {
		if h.StoreWatermark.Beats > behind.Load() && behind.Load() > 0 {
			refusals.Add(1)
			return fmt.Errorf("%w: the store is at beat %d", gateway.ErrStoreBehind, behind.Load())
		}
		return nil
	}
	dir := t.TempDir()
	cfg := siteConfig(t, env, dir)
	cfg.HeartbeatInterval = watermarkHeartbeat
	hellos := func() []gateway.Hello { return env.Queue.Counts().Hellos }

	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, cfg, newCounter())
	poll(t, 5*time.Second, "the first stream", func() bool { return len(hellos()) >= 1 })
	if got := hellos()[0].StoreWatermark; got != (gateway.Watermark{}) {
		t.Fatalf("a new agent named watermark %+v", got)
	}
	path := filepath.Join(dir, agentlink.WatermarkFile)
	kept := func() gateway.Watermark {
		b, err := os.ReadFile(path)
		if err != nil {
			return gateway.Watermark{}
		}
		var w struct {
			StoreID       string
			Fences, Beats int64
		}
		if err := json.Unmarshal(b, &w); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return gateway.Watermark{StoreID: w.StoreID, Fences: w.Fences, Beats: w.Beats}
	}
	beats.Store(7)
	poll(t, 5*time.Second, "the watermark kept", func() bool { return kept().Beats == 7 })
	beats.Store(9)
	poll(t, 5*time.Second, "the newer watermark kept", func() bool { return kept().Beats == 9 })
	beats.Store(3) // an older one (the gateway's store went back): the agent keeps what it saw
	before := len(hellos())
	env.Kill()
	poll(t, 5*time.Second, "a new stream", func() bool { return len(hellos()) > before })
	want := gateway.Watermark{StoreID: "store-1", Fences: 1, Beats: 9}
	if got := hellos()[len(hellos())-1].StoreWatermark; got != want {
		t.Fatalf("the new stream's Hello named %+v, want %+v", got, want)
	}
	stop(t, cancel, l)
	if got := kept(); got != want {
		t.Fatalf("kept %+v after older answers, want %+v", got, want)
	}

	// After a restart, from the data dir.
	n := len(hellos())
	ctx, cancel = context.WithCancel(context.Background())
	l = dial(t, ctx, cfg, newCounter())
	poll(t, 5*time.Second, "the stream after the restart", func() bool { return len(hellos()) > n })
	if got := hellos()[n].StoreWatermark; got != want {
		t.Fatalf("after a restart the Hello named %+v, want %+v", got, want)
	}

	// The store restored behind it: refused, and the agent keeps trying until it is let in.
	behind.Store(4)
	env.Kill()
	poll(t, 5*time.Second, "refusals of the witness", func() bool { return refusals.Load() >= 2 })
	opened := len(hellos())
	behind.Store(0) // the fence
	poll(t, 5*time.Second, "the witness let in after the fence", func() bool { return len(hellos()) > opened })
	stop(t, cancel, l)
}

// An agent names in its Hello the last command it took, with the watermark it took it under:
// a store at that fence without it was restored from a backup taken before it was sent, even
// less than a beat before (what the beats cannot tell). A command taken before a fence, or from
// another store, is not named: the store after the fence, or the other store, need not have it.
// The name survives a restart and the journal's compaction.
func TestAgentNamesItsLastCommand(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	var fences atomic.Int64
	fences.Store(2)
	env := gatewaytest.Start(t, gateway.Config{PollInterval: 50 * time.Millisecond, Logger: testLogger(t),
		Watermark: func() (gateway.Watermark, bool) {
			return gateway.Watermark{StoreID: "store-1", Fences: fences.Load(), Beats: 4}, true
		}})
	dir := t.TempDir()
	cfg := siteConfig(t, env, dir)
	cfg.HeartbeatInterval = watermarkHeartbeat
	hellos := func() []gateway.Hello { return env.Queue.Counts().Hellos }
	lastHello := func() gateway.Hello { h := hellos(); return h[len(h)-1] }

	// A command waits before the agent's first stream: the gateway sends the watermark before
	// it, and the command is journaled under it.
	env.Queue.Enqueue(siteRef, commands("first", 1)...)
	ctx, cancel := context.WithCancel(context.Background())
	l := dial(t, ctx, cfg, newCounter())
	poll(t, 5*time.Second, "the first stream", func() bool { return len(hellos()) >= 1 })
	if got := hellos()[0].ResumeAfter; got != "" {
		t.Fatalf("a new agent named command %q", got)
	}
	waitFinal(t, env.Queue, 1)
	n := len(hellos())
	env.Kill()
	poll(t, 5*time.Second, "a new stream", func() bool { return len(hellos()) > n })
	if got := lastHello(); got.ResumeAfter != "first-00000" || got.StoreWatermark.Fences != 2 {
		t.Fatalf("after a command, the Hello named %q at %+v, want first-00000 at fence 2", got.ResumeAfter, got.StoreWatermark)
	}
	stop(t, cancel, l)

	// After a restart, from the journal.
	n = len(hellos())
	ctx, cancel = context.WithCancel(context.Background())
	l = dial(t, ctx, cfg, newCounter())
	poll(t, 5*time.Second, "the stream after the restart", func() bool { return len(hellos()) > n })
	if got := hellos()[n].ResumeAfter; got != "first-00000" {
		t.Fatalf("after a restart the Hello named %q, want first-00000", got)
	}

	// A fence: the agent learns it, and no longer names what it took before.
	fences.Store(3)
	path := filepath.Join(dir, agentlink.WatermarkFile)
	poll(t, 5*time.Second, "the fence kept", func() bool {
		b, _ := os.ReadFile(path)
		var w struct{ Fences int64 }
		_ = json.Unmarshal(b, &w)
		return w.Fences == 3
	})
	n = len(hellos())
	env.Kill()
	poll(t, 5*time.Second, "a stream after the fence", func() bool { return len(hellos()) > n })
	if got := lastHello(); got.ResumeAfter != "" || got.StoreWatermark.Fences != 3 {
		t.Fatalf("after a fence the Hello named %q at %+v, want nothing at fence 3", got.ResumeAfter, got.StoreWatermark)
	}
	env.Queue.Enqueue(siteRef, commands("second", 1)...)
	waitFinal(t, env.Queue, 2)
	n = len(hellos())
	env.Kill()
	poll(t, 5*time.Second, "a stream after the second command", func() bool { return len(hellos()) > n })
	if got := lastHello(); got.ResumeAfter != "second-00000" {
		t.Fatalf("after a command at the new fence the Hello named %q, want second-00000", got.ResumeAfter)
	}
	stop(t, cancel, l)
}
