package engine

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/pki"
	"bcd/internal/store"
	"bcd/internal/store/storetest"
	"bcd/internal/workflow"
)

// The gate admits as many at a time as it has slots; the others wait for one to leave, and each
// that leaves lets exactly one more in.
func TestCPUGateAdmitsAtMostItsSlots(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(string(rune('0'+n)), func(t *testing.T) {
			g := newCPUGate(n)
			entered := make(chan struct{})
			release := make(chan struct{})
			var inside, most atomic.Int64
			var wg sync.WaitGroup
			for range n + 2 {
				wg.Go(func() {
					if err := g.run(context.Background(), func() {
						now := inside.Add(1)
						for m := most.Load(); now > m && !most.CompareAndSwap(m, now); m = most.Load() {
						}
						entered <- struct{}{}
						<-release
						inside.Add(-1)
					}); err != nil {
						t.Error(err)
					}
				})
			}
			receive := func(what string) {
				t.Helper()
				select {
				case <-entered:
				case <-time.After(10 * time.Second):
					t.Fatalf("%s: nobody entered", what)
				}
			}
			for range n {
				receive("filling the slots")
			}
			// The slots are full: nobody else can have been admitted.
			if got := g.admitted.Load(); got != int64(n) {
				t.Fatalf("%d admitted with %d slots held, want %d", got, n, n)
			}
			release <- struct{}{}
			receive("after one left")
			if got := g.admitted.Load(); got != int64(n)+1 {
				t.Fatalf("%d admitted after one left, want %d", got, n+1)
			}
			release <- struct{}{}
			receive("after a second left")
			close(release)
			wg.Wait()
			if got := most.Load(); got != int64(n) {
				t.Errorf("at most %d were inside at once, want %d", got, n)
			}
			if got := g.admitted.Load(); got != int64(n)+2 {
				t.Errorf("%d admitted in all, want %d", got, n+2)
			}
		})
	}
}

// A caller whose context ends while it waits for a slot gets the context's error, and its work
// is not run.
func TestCPUGateGivesUpWhenTheContextEnds(t *testing.T) {
	g := newCPUGate(1)
	held, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() { done <- g.run(context.Background(), func() { close(held); <-release }) }()
	<-held
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	if err := g.run(ctx, func() { ran = true }); !errors.Is(err, context.Canceled) || ran {
		t.Errorf("waiting on a full gate with an ended context: %v (ran: %v), want context.Canceled and not run", err, ran)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The engine's gate leaves one processor to the store's writer, and has at least one slot.
func TestCPUGateLeavesTheWriterAProcessor(t *testing.T) {
	want := max(1, runtime.GOMAXPROCS(0)-1)
	e := New(storetest.Open(t, store.SQLite), nil, nil, Config{})
	if got := e.cpu.slots; got != want {
		t.Errorf("the engine's gate has %d slots with GOMAXPROCS %d, want %d", got, runtime.GOMAXPROCS(0), want)
	}
}

// The CPU-heavy work done for agents beside the writer goes through the gate: a claim's
// candidates, a joining node's certificate, an attested result's early check.
func TestAgentWorkGoesThroughTheCPUGate(t *testing.T) {
	ctx := context.Background()
	st := storetest.Open(t, store.SQLite)
	f := newWFFixture(t, st, "inspecting", "ready", []workflow.Step{{Use: "boot.prepareRamdisk", Timeout: time.Hour}}, nil, Config{})
	f.checkAttestations(t, time.Now())
	f.run(t)
	admitted := f.e.cpu.admitted.Load()
	through := func(what string) {
		t.Helper()
		if now := f.e.cpu.admitted.Load(); now != admitted+1 {
			t.Errorf("%s: %d admissions to the gate, want 1", what, now-admitted)
		}
		admitted = f.e.cpu.admitted.Load()
	}
	cmds, err := f.e.Claim(ctx, f.site, 10)
	if err != nil || len(cmds) != 1 {
		t.Fatalf("claimed %+v, %v; want the workflow's boot.prepareRamdisk", cmds, err)
	}
	through("a claim")
	var args struct{ Token string }
	if err := json.Unmarshal([]byte(cmds[0].Args), &args); err != nil || args.Token == "" {
		t.Fatalf("the claimed command carries no token: %s", cmds[0].Args)
	}
	_, csr, err := pki.NewKeyAndCSR("ramdisk")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := f.e.JoinNode(ctx, args.Token, csr, "node"); err != nil {
		t.Fatal(err)
	}
	through("a node's join")
	c := store.Command{ID: cmds[0].ID, NodeID: f.node.ID, Kind: "disk.wipe", Generation: f.node.IdentityGeneration}
	if err := f.e.preverify(ctx, c, Update{CommandID: c.ID, State: "succeeded", NodeSig: []byte("sig"), SignerCertDER: []byte("not a certificate")}); err == nil {
		t.Error("an attestation by no certificate passed the early check")
	}
	through("an attested result's early check")
	ran := false
	if err := f.e.CPUBound(ctx, func() { ran = true }); err != nil || !ran {
		t.Errorf("CPUBound: %v (ran: %v)", err, ran)
	}
	through("CPUBound")
}

// A claim's candidates are read through the gate on SQLite, where the read is this process's
// CPU, and outside it on PostgreSQL, where it is a round trip: a slot held across the network
// kept every certificate and result check waiting (the gate's mean wait was 1.0–1.5 s in
// bcd sim at 2 000 nodes).
func TestClaimsReadThroughTheGateOnSQLiteOnly(t *testing.T) {
	storetest.Each(t, func(t *testing.T, st *store.Store) {
		f := newWFFixture(t, st, "inspecting", "ready", []workflow.Step{{Use: "boot.prepareRamdisk", Timeout: time.Hour}}, nil, Config{})
		f.run(t)
		before := f.e.cpu.admitted.Load()
		cmds, err := f.e.Claim(context.Background(), f.site, 10)
		if err != nil || len(cmds) != 1 {
			t.Fatalf("claimed %+v, %v; want the workflow's boot.prepareRamdisk", cmds, err)
		}
		want := int64(0)
		if st.Engine() == store.SQLite {
			want = 1
		}
		if got := f.e.cpu.admitted.Load() - before; got != want {
			t.Errorf("a claim on %s took %d slots of the gate, want %d", st.Engine(), got, want)
		}
	})
}

// A site agent's claim (runFirst) is admitted before the node work that waited longer (run);
// within a lane, waiters are admitted in the order they came; one that gives up leaves the
// queue and the slot goes to the next.
func TestCPUGateAdmitsASiteAgentsClaimFirst(t *testing.T) {
	g := newCPUGate(1)
	held, release := make(chan struct{}), make(chan struct{})
	go func() {
		if err := g.run(context.Background(), func() { close(held); <-release }); err != nil {
			t.Error(err)
		}
	}()
	<-held
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	queued := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			g.mu.Lock()
			got := len(g.lanes[laneFirst]) + len(g.lanes[laneRest])
			g.mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d waiting, want %d", got, n)
			}
			runtime.Gosched()
		}
	}
	wait := func(name string, run func(context.Context, func()) error, ctx context.Context) {
		wg.Go(func() {
			err := run(ctx, func() {
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
			})
			if ctx.Err() == nil && err != nil {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
	gone, giveUp := context.WithCancel(context.Background())
	wait("node 1", g.run, context.Background())
	queued(1)
	wait("gives up", g.run, gone)
	queued(2)
	wait("node 2", g.run, context.Background())
	queued(3)
	wait("site 1", g.runFirst, context.Background())
	queued(4)
	wait("site 2", g.runFirst, context.Background())
	queued(5)
	giveUp()
	queued(4)
	close(release)
	wg.Wait()
	want := []string{"site 1", "site 2", "node 1", "node 2"}
	if !slices.Equal(order, want) {
		t.Errorf("admitted %v, want %v", order, want)
	}
	if st := g.stats(); st.Admitted != 5 || g.free != 1 {
		t.Errorf("after all left: %d admitted, %d slots free; want 5 and 1", st.Admitted, g.free)
	}
}
