package engine

import (
	"context"
	"log/slog"
	"slices"
	"testing"
	"time"

	"bcd/internal/gateway"
	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// cancelFixture: a workflow whose step's command a site agent runs on server B while server A
// (the fixture's engine) reconciles the node, both on one store.
type cancelFixture struct {
	*wfFixture
	b  *Engine
	a  Agent
	id string // the running command
}

func newCancelFixture(t *testing.T, st *store.Store) *cancelFixture {
	t.Helper()
	ctx := context.Background()
	f := newWFFixture(t, st, "rescue", "deployed", []workflow.Step{{Use: "power.getPower"}}, []workflow.Step{{Use: "boot.cleanUp"}}, Config{})
	f.run(t)
	b := New(st, nil, slog.New(slog.DiscardHandler), Config{AgentGrace: time.Second})
	b.AcceptIngestedAttestationForTests()
	a := f.site
	if err := b.Connected(ctx, a, "v"); err != nil {
		t.Fatal(err)
	}
	cmds, err := b.Claim(ctx, a, 10)
	if err != nil || len(cmds) != 1 {
		t.Fatalf("claimed %d on server B, %v", len(cmds), err)
	}
	id := cmds[0].ID
	if err := b.Ack(ctx, a, id); err != nil {
		t.Fatal(err)
	}
	if err := b.Report(ctx, a, Update{CommandID: id, State: "running"}); err != nil {
		t.Fatal(err)
	}
	return &cancelFixture{wfFixture: f, b: b, a: a, id: id}
}

// giveUp has server A abort the workflow: it gives the running command up.
func (f *cancelFixture) giveUp(t *testing.T) {
	t.Helper()
	abortNode(t, f.st, f.node.ID)
	f.run(t)
	if c := f.commands(t, "bmc.query")[0]; c.State != "failed" {
		t.Fatalf("the given-up command is %s", c.State)
	}
}

// cancels is what the gateway of server e tells agent a to cancel.
func cancelsOn(t *testing.T, e *Engine, a Agent) []string {
	t.Helper()
	ids, err := e.Gateway().Cancels(context.Background(), gateway.AgentRef{Kind: pki.KindSiteAgent, AgentID: a.ID, SiteID: a.SiteID})
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// An agent connected to server B is told to cancel the command server A gave up under it:
// the request is in the store, and B learns it at its heartbeat (the notice of another server
// missed), at the agent's next connection, or on a server started since; it ends when the
// agent reports on the command, on every server.
func TestCancelReachesTheAgentOnAnotherServer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		learn func(t *testing.T, f *cancelFixture) (*Engine, Agent)
	}{
		{"at the serving server's heartbeat", func(t *testing.T, f *cancelFixture) (*Engine, Agent) {
			if err := f.b.Heartbeat(context.Background()); err != nil {
				t.Fatal(err)
			}
			return f.b, f.a
		}},
		{"when the agent connects again", func(t *testing.T, f *cancelFixture) (*Engine, Agent) {
			a := f.a
			a.ConnID = "conn-2"
			if err := f.b.Connected(context.Background(), a, "v"); err != nil {
				t.Fatal(err)
			}
			return f.b, a
		}},
		{"on a server started since", func(t *testing.T, f *cancelFixture) (*Engine, Agent) {
			c := New(f.st, nil, slog.New(slog.DiscardHandler), Config{AgentGrace: time.Second})
			a := f.a
			a.ConnID = "conn-c"
			if err := c.Connected(context.Background(), a, "v"); err != nil {
				t.Fatal(err)
			}
			return c, a
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.Each(t, func(t *testing.T, st *store.Store) {
				ctx := context.Background()
				f := newCancelFixture(t, st)
				f.giveUp(t)
				if ids := cancelsOn(t, f.e, f.a); !slices.Equal(ids, []string{f.id}) {
					t.Fatalf("server A's own cancels: %v", ids)
				}
				if ids := cancelsOn(t, f.b, f.a); len(ids) != 0 {
					t.Fatalf("server B knew of the cancel before reading the store: %v", ids)
				}
				e, a := tc.learn(t, f)
				if ids := cancelsOn(t, e, a); !slices.Equal(ids, []string{f.id}) {
					t.Fatalf("the serving server tells the agent to cancel %v, want [%s]", ids, f.id)
				}
				// The agent stopped the command and reports it: the cancel ends on the
				// serving server at once, in the store, and on a server that gave it up and
				// to which the agent connects later.
				if err := e.Report(ctx, a, Update{CommandID: f.id, State: "failed", Error: "cancelled"}); err != nil {
					t.Fatal(err)
				}
				if ids := cancelsOn(t, e, a); len(ids) != 0 {
					t.Errorf("cancels after the agent's report: %v", ids)
				}
				if p, err := st.PendingCancels(ctx, a.ID); err != nil || len(p) != 0 {
					t.Errorf("cancels in the store after the agent's report: %+v (%v)", p, err)
				}
				back := a
				back.ConnID = "conn-a"
				if err := f.e.Connected(ctx, back, "v"); err != nil {
					t.Fatal(err)
				}
				if ids := cancelsOn(t, f.e, back); len(ids) != 0 {
					t.Errorf("server A still tells the agent, back on it, to cancel %v", ids)
				}
			})
		})
	}
}

// A cancel nobody reports on ends after cancelKeep, at the heartbeat of a server serving the
// agent.
func TestCancelEndsAfterItsTime(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		ctx := context.Background()
		f := newCancelFixture(t, st)
		f.giveUp(t)
		if err := f.b.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
		if ids := cancelsOn(t, f.b, f.a); len(ids) != 1 {
			t.Fatalf("cancels: %v", ids)
		}
		f.clock.Add(cancelKeep + time.Minute)
		if err := f.b.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
		if p, err := st.PendingCancels(ctx, f.a.ID); err != nil || len(p) != 0 {
			t.Fatalf("cancels in the store past their time: %+v (%v)", p, err)
		}
		if ids := cancelsOn(t, f.b, f.a); len(ids) != 0 {
			t.Fatalf("server B still tells the agent to cancel %v past its time", ids)
		}
	})
}

// On PostgreSQL the server that gives a command up tells the others (cancelNotice): the one
// serving the agent reads its cancels at once, long before its next heartbeat (none runs here).
func TestCancelNoticeReachesTheServingServer(t *testing.T) {
	st := storetest.Open(t, store.Postgres)
	ctx, stop := context.WithCancel(context.Background())
	f := newCancelFixture(t, st)
	done := make(chan struct{}, 2)
	go func() { f.e.tellOthers(ctx); done <- struct{}{} }()
	go func() { f.b.hearOthers(ctx); done <- struct{}{} }()
	defer func() { stop(); <-done; <-done }()
	// B listens once its connection is up: publish until it hears.
	probe, end := f.b.Subscribe(Agent{Kind: "site", SiteID: "probe"})
	defer end()
	listening := time.After(10 * time.Second)
	for heard := false; !heard; {
		f.e.publish([]notice{"site:probe"})
		select {
		case <-probe:
			heard = true
		case <-time.After(50 * time.Millisecond):
		case <-listening:
			t.Fatal("server B never heard server A")
		}
	}
	start := time.Now()
	f.giveUp(t)
	deadline := time.After(3 * time.Second)
	for {
		if ids := cancelsOn(t, f.b, f.a); slices.Equal(ids, []string{f.id}) {
			break
		}
		select {
		case <-deadline:
			t.Fatalf("server B did not learn the cancel within 3 s of server A's notice")
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Logf("server B learned the cancel %s after server A gave the command up", time.Since(start).Round(time.Millisecond))
}
