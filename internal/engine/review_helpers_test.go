package engine

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/workflow"
)

// clock is a store clock a test moves by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// wfFixture is one node, in a workflow-driven state, with an open workflow of steps and cleanup
// written by the test, and a site agent of its site.
type wfFixture struct {
	st    *store.Store
	e     *Engine
	clock *clock
	node  store.Node
	site  Agent
}

// newWFFixture seeds a tenant, site and pool, a node in state (target target) and an open
// workflow of steps and cleanup (resolved as a profile would be), and wakes the node.
func newWFFixture(t *testing.T, st *store.Store, state, target string, steps, cleanup []workflow.Step, cfg Config) *wfFixture {
	t.Helper()
	ctx := context.Background()
	c := &clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	st.SetClock(c.Now)
	res, err := workflow.Resolve(workflow.Profile{Name: "test", Steps: steps, Cleanup: cleanup}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &wfFixture{st: st, clock: c}
	err = st.Write(ctx, func(tx *store.Tx) error {
		var err error
		if f.node, err = insertTestNode(ctx, tx, c, state, target); err != nil {
			return err
		}
		s, _ := json.Marshal(res.Steps)
		cl, _ := json.Marshal(res.Cleanup)
		wf := store.Workflow{NodeID: f.node.ID, TenantID: f.node.TenantID, Profile: "test", Owner: "metal", NodeState: state,
			Steps: string(s), Cleanup: string(cl), CommandKinds: res.CommandKinds, State: wfRunning, Phase: "steps"}
		if err := tx.InsertWorkflow(ctx, &wf); err != nil {
			return err
		}
		return tx.Wake(ctx, f.node.ID, "test", 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.AgentGrace == 0 {
		cfg.AgentGrace = time.Second
	}
	f.e = New(st, nil, nil, cfg)
	f.e.AcceptIngestedAttestationForTests()
	f.site = Agent{ID: "site-a1", Kind: "site", SiteID: f.node.SiteID, ConnID: "conn-1"}
	return f
}

// insertTestNode seeds a tenant, site and pool and one node of them in state (target target),
// powered on, with a Redfish BMC and one MAC.
func insertTestNode(ctx context.Context, tx *store.Tx, c *clock, state, target string) (store.Node, error) {
	tn, err := tx.InsertTenant(ctx, "t")
	if err != nil {
		return store.Node{}, err
	}
	site, err := tx.InsertSite(ctx, tn.ID, "s", nil)
	if err != nil {
		return store.Node{}, err
	}
	pool, err := tx.InsertPool(ctx, store.Pool{TenantID: tn.ID, SiteID: site.ID, Name: "p"})
	if err != nil {
		return store.Node{}, err
	}
	n := store.Node{ID: store.NewID(c.Now()), TenantID: tn.ID, SiteID: site.ID, PoolID: pool.ID, Name: "n0",
		State: state, TargetState: target, Power: "on", BMCDriver: "redfish", BMCAddress: "https://10.0.0.9",
		BMCUsernameRef: "secret://u", BMCPasswordRef: "secret://p", MACs: []string{"52:54:00:00:00:01"}}
	return n, tx.InsertNode(ctx, &n)
}

// checkAttestations gives f an engine that checks attestations for real, against a CA made at
// at, which it returns.
func (f *wfFixture) checkAttestations(t *testing.T, at time.Time) *pki.CA {
	t.Helper()
	ca, err := pki.CreateCA("test", at)
	if err != nil {
		t.Fatal(err)
	}
	f.e = New(f.st, ca, nil, Config{AgentGrace: time.Second})
	return ca
}

// run reconciles every due node.
func (f *wfFixture) run(t *testing.T) {
	t.Helper()
	if _, err := f.e.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// commands lists the node's commands of kind, oldest first.
func (f *wfFixture) commands(t *testing.T, kind string) []store.Command {
	t.Helper()
	all, err := f.st.Commands(context.Background(), f.node.ID, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var out []store.Command
	for _, c := range all {
		if kind == "" || c.Kind == kind {
			out = append(out, c)
		}
	}
	return out
}

// workflow reads the node's last workflow.
func (f *wfFixture) workflow(t *testing.T) store.Workflow {
	t.Helper()
	wfs, err := f.st.Workflows(context.Background(), f.node.ID, 1)
	if err != nil || len(wfs) == 0 {
		t.Fatalf("workflows: %v %v", wfs, err)
	}
	return wfs[0]
}

// nodeNow reads the node.
func (f *wfFixture) nodeNow(t *testing.T) store.Node {
	t.Helper()
	n, err := f.st.Node(context.Background(), f.node.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	return n
}
