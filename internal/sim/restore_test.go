package sim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/gateway"
	"bcd/internal/metal"
	"bcd/internal/pki"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// A store restored from a backup in which an inspection's first command was still queued,
// while in fact agent A took and ran it after the backup: the fence records it lost, so no
// agent is ever given it (A's acknowledgement is refused, B's claims never hold it); the step
// decides, retrying with a new command that B runs, and the inspection goes on. The step's
// event says why the command was lost. A fence is refused while a server is alive on the store.
// Commands the agents name that the store never had are recorded as evidence of the restore.
func TestRestoreFenceLosesQueuedCommands(t *testing.T) {
	ctx := context.Background()
	cfg := engine.Config{AgentGrace: time.Minute, PeerTimeout: time.Minute}
	st, h, node, eng, a, b := byHand(t, cfg)
	if err := h.Apply(ctx, provision.VerbInspect, []string{node}, metal.VerbInput{}); err != nil {
		t.Fatal(err)
	}
	var fenced store.Command
	waitFor(t, "the inspection's first command queued", func() bool {
		if _, err := eng.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		wf := openWorkflow(t, st, node)
		if wf.CurrentCommand == "" {
			return false
		}
		c, err := st.Command(ctx, wf.CurrentCommand)
		if err != nil {
			t.Fatal(err)
		}
		fenced = c
		return c.State == "queued"
	})
	was := openWorkflow(t, st, node)
	if err := eng.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.FenceRestore(ctx, st, cfg.PeerTimeout, ""); !errors.Is(err, engine.ErrServersAlive) {
		t.Fatalf("a fence beside a live server: %v", err)
	}
	f, err := engine.FenceRestore(ctx, st, 0, "restored")
	if err != nil {
		t.Fatal(err)
	}
	if f.Commands != 1 || len(f.Nodes) != 1 || f.Nodes[0] != node {
		t.Fatalf("fenced %+v, want the one command of %s", f, node)
	}
	// A, which took it after the backup, reconnects and acknowledges it again: refused.
	if err := eng.Ack(ctx, a, fenced.ID); err == nil {
		t.Fatal("A's acknowledgement of the fenced command was accepted")
	}
	// A also reports a command it received after the backup, which the store never had: the
	// report is refused, and recorded once as evidence of the restore, however often it comes.
	for range 2 {
		if err := eng.Report(ctx, a, engine.Update{CommandID: "cmd-after-the-backup", State: "succeeded", Result: []byte(`{}`)}); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a report on a command unknown to the store: %v", err)
		}
	}
	if refused, err := eng.AckAll(ctx, a, []string{"cmd-after-the-backup", "another-after-the-backup"}); err != nil || len(refused) != 2 {
		t.Fatalf("acknowledgements of commands unknown to the store: %v %v", refused, err)
	}
	evs, err := st.Events(ctx, store.EventFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var unknown []string
	for _, e := range evs {
		if e.Kind == "control_plane.unknown_command" {
			unknown = append(unknown, e.Data)
		}
	}
	if len(unknown) != 2 || !strings.Contains(unknown[0], `"commands":["cmd-after-the-backup"]`) || !strings.Contains(unknown[0], `"what":"reported"`) ||
		!strings.Contains(unknown[1], `"commands":["another-after-the-backup"]`) || !strings.Contains(unknown[1], `"what":"acknowledged"`) {
		t.Errorf("unknown command events %q: want one for the report, one for the new acknowledgement", unknown)
	}
	var retry store.Command
	waitFor(t, "the step's retry taken by B", func() bool {
		if _, err := eng.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		got, err := eng.Claim(ctx, b, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range got {
			if c.ID == fenced.ID {
				t.Fatalf("agent B was given the fenced command %s", c.ID)
			}
			if c.Kind != fenced.Kind {
				t.Fatalf("agent B was given %s, want the retry of %s", c.Kind, fenced.Kind)
			}
			retry = c
		}
		return retry.ID != ""
	})
	if err := eng.Ack(ctx, b, retry.ID); err != nil {
		t.Fatal(err)
	}
	if err := eng.Report(ctx, b, engine.Update{CommandID: retry.ID, State: "succeeded", Result: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the inspection's next step", func() bool {
		if _, err := eng.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		return openWorkflow(t, st, node).StepIndex > was.StepIndex
	})
	if c, _ := st.Command(ctx, fenced.ID); c.State != "lost" || c.Error != store.RestoreFenceError {
		t.Fatalf("the fenced command: %s (%s)", c.State, c.Error)
	}
	if n, _ := st.Node(ctx, node, ""); n.State != "inspecting" || n.FaultCode != "" {
		t.Fatalf("node %s %s %s", n.State, n.FaultCode, n.FaultMsg)
	}
	if rs := reasons(t, st, node); !hasReason(rs, fenced.Kind+" lost: "+store.RestoreFenceError) {
		t.Errorf("step events %q: want the loss by the fence", strings.Join(rs, " | "))
	}
}

// A store restored onto a new host (no server kept a watermark) is behind what its agents saw:
// the first agent that names a newer watermark of the store is refused and recorded once, and
// from then on no server gives any agent a command (another server learns it at its next
// heartbeat) until the fence, which clears it. An agent whose watermark is not ahead is let in.
func TestAgentWitnessesRestore(t *testing.T) {
	ctx := context.Background()
	cfg := engine.Config{AgentGrace: time.Minute, PeerTimeout: time.Minute}
	st, h, node, eng, a, b := byHand(t, cfg)
	other := engine.New(st, nil, nil2(), cfg) // a second server on the store
	for _, e := range []*engine.Engine{eng, other} {
		if err := e.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	told, ok := eng.Watermark()
	if !ok || told.StoreID == "" {
		t.Fatalf("no watermark to tell the agents after a heartbeat: %+v %v", told, ok)
	}
	gw := eng.Gateway()
	siteRef := func(ag engine.Agent) gateway.AgentRef {
		return gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: ag.SiteID, AgentID: ag.ID}
	}
	hello := func(w store.Watermark) gateway.Hello {
		return gateway.Hello{AgentVersion: "t", StoreWatermark: gateway.Watermark{StoreID: w.StoreID, Fences: w.Fences, Beats: w.Beats}}
	}
	if err := gw.Connected(ctx, siteRef(b), hello(told)); err != nil {
		t.Fatalf("an agent that saw the store as it is: %v", err)
	}
	if err := gw.Connected(ctx, siteRef(b), hello(store.Watermark{StoreID: "another-store", Beats: 1 << 40})); err != nil {
		t.Fatalf("an agent that saw another store: %v", err)
	}
	power(t, h, node, "off")

	// A saw five more beats than the backup holds.
	ahead := told
	ahead.Beats += 5
	err := gw.Connected(ctx, siteRef(a), hello(ahead))
	if !errors.Is(err, gateway.ErrStoreBehind) || !strings.Contains(err.Error(), "bcd store after-restore") {
		t.Fatalf("an agent that saw a newer store: %v", err)
	}
	if err := gw.Connected(ctx, siteRef(b), hello(ahead)); !errors.Is(err, gateway.ErrStoreBehind) {
		t.Fatalf("a second witness: %v", err)
	}
	if got, err := eng.Claim(ctx, b, 10); err != nil || len(got) != 0 {
		t.Fatalf("after the witness, B was given %d commands (%v)", len(got), err)
	}
	if err := other.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := other.Claim(ctx, b, 10); err != nil || len(got) != 0 {
		t.Fatalf("after the witness and its heartbeat, the other server gave B %d commands (%v)", len(got), err)
	}
	w, ok, err := st.RestoreWitnessed(ctx)
	if err != nil || !ok || w.AgentID != a.ID || w.Seen != ahead {
		t.Fatalf("witness recorded %+v %v %v, want agent %s at %+v", w, ok, err, a.ID, ahead)
	}
	evs, err := st.Events(ctx, store.EventFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.Kind == "control_plane.restore_witnessed" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d control_plane.restore_witnessed events, want 1", n)
	}

	// The operator stops the servers and runs the fence; a server started after it sends again,
	// and A, whose watermark is of the fence before, is let in.
	if _, err := engine.FenceRestore(ctx, st, 0, "restored onto a new host"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.RestoreWitnessed(ctx); err != nil || ok {
		t.Fatalf("after the fence, witnessed %v %v", ok, err)
	}
	after := engine.New(st, nil, nil2(), cfg)
	if err := after.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := after.Gateway().Connected(ctx, siteRef(a), hello(ahead)); err != nil {
		t.Fatalf("after the fence, the witness: %v", err)
	}
	after.Connected(ctx, b, "t")
	power(t, h, node, "on")
	if got, err := after.Claim(ctx, b, 10); err != nil || len(got) != 1 {
		t.Fatalf("after the fence, B was given %d commands (%v), want the new one", len(got), err)
	}
}

// A store restored from a backup taken less than a beat before the last command a site agent
// took (or a PostgreSQL failed over to a standby that had not received it): the beats match,
// but the agent names the command, which the store does not have. It is the witness: refused,
// recorded with the command, and no server sends a command until the fence. A command the store
// has, one named under another fence or store, and one a node's agent names, are let in.
func TestAgentWitnessesLostCommand(t *testing.T) {
	ctx := context.Background()
	cfg := engine.Config{AgentGrace: time.Minute, PeerTimeout: time.Minute}
	st, h, node, eng, a, b := byHand(t, cfg)
	if err := eng.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	told, _ := eng.Watermark()
	gw := eng.Gateway()
	siteRef := func(ag engine.Agent) gateway.AgentRef {
		return gateway.AgentRef{Kind: pki.KindSiteAgent, SiteID: ag.SiteID, AgentID: ag.ID}
	}
	hello := func(w store.Watermark, last string) gateway.Hello {
		return gateway.Hello{AgentVersion: "t", ResumeAfter: last, StoreWatermark: gateway.Watermark{StoreID: w.StoreID, Fences: w.Fences, Beats: w.Beats}}
	}
	eng.Connected(ctx, b, "t")
	power(t, h, node, "off")
	got, err := eng.Claim(ctx, b, 10)
	if err != nil || len(got) != 1 {
		t.Fatalf("claimed %d commands (%v), want the power action", len(got), err)
	}
	earlierFence, otherStore := told, told
	earlierFence.Fences--
	otherStore.StoreID = "another-store"
	for _, tc := range []struct {
		name string
		ref  gateway.AgentRef
		h    gateway.Hello
	}{
		{"a command the store has", siteRef(b), hello(told, got[0].ID)},
		{"no command", siteRef(a), hello(told, "")},
		{"a lost command named under an earlier fence", siteRef(a), hello(earlierFence, "c-lost")},
		{"a lost command of another store", siteRef(a), hello(otherStore, "c-lost")},
		{"a node's agent", gateway.AgentRef{Kind: pki.KindNode, NodeID: node, Generation: 1}, hello(told, "c-lost")},
	} {
		if err := gw.Connected(ctx, tc.ref, tc.h); err != nil {
			t.Fatalf("%s: refused: %v", tc.name, err)
		}
	}
	if _, ok, err := st.RestoreWitnessed(ctx); err != nil || ok {
		t.Fatalf("witnessed %v %v before any lost command", ok, err)
	}

	err = gw.Connected(ctx, siteRef(a), hello(told, "c-lost"))
	if !errors.Is(err, gateway.ErrStoreBehind) || !strings.Contains(err.Error(), "c-lost") {
		t.Fatalf("an agent that took a command the store does not have: %v", err)
	}
	w, ok, err := st.RestoreWitnessed(ctx)
	if err != nil || !ok || w.AgentID != a.ID || w.Command != "c-lost" {
		t.Fatalf("witness recorded %+v %v %v, want agent %s with command c-lost", w, ok, err, a.ID)
	}
	power(t, h, node, "on")
	if got, err := eng.Claim(ctx, b, 10); err != nil || len(got) != 0 {
		t.Fatalf("after the witness, B was given %d commands (%v)", len(got), err)
	}

	// The fence: the agent, whose last command came under the fence before, is let in.
	fence, err := engine.FenceRestore(ctx, st, 0, "failed over to a standby")
	if err != nil {
		t.Fatal(err)
	}
	after := engine.New(st, nil, nil2(), cfg)
	if err := after.Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := after.Gateway().Connected(ctx, siteRef(a), hello(told, "c-lost")); err != nil {
		t.Fatalf("after the fence (%v), the witness: %v", fence, err)
	}
}
