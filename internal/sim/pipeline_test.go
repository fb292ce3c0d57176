package sim

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bcd/internal/engine"
	"bcd/internal/store"
)

// pipeLink hands out full batches and holds each acknowledgement until the test lets it go.
type pipeLink struct {
	Link
	mu      sync.Mutex
	claims  int
	acking  int // acknowledgements under way
	most    int // the most under way at once
	acked   []int
	claimed chan int      // each claim's number
	letGo   chan struct{} // one acknowledgement may return
	batches int           // claims that hand out a batch; later ones find none
}

// batchOf is the claim that handed out command id.
func batchOf(id string) int {
	var n, i int
	if _, err := fmt.Sscanf(id, "%d-%d", &n, &i); err != nil {
		return 0
	}
	return n
}

func (l *pipeLink) Claim(_ context.Context, _ engine.Agent, limit int) ([]store.Command, error) {
	l.mu.Lock()
	l.claims++
	n := l.claims
	l.mu.Unlock()
	l.claimed <- n
	if n > l.batches {
		return nil, nil
	}
	cmds := make([]store.Command, limit)
	for i := range cmds {
		cmds[i] = store.Command{ID: fmt.Sprintf("%d-%d", n, i), Kind: "bmc.query"}
	}
	return cmds, nil
}

func (l *pipeLink) AckAll(_ context.Context, _ engine.Agent, ids []string) (map[string]error, error) {
	l.mu.Lock()
	l.acking++
	l.most = max(l.most, l.acking)
	l.mu.Unlock()
	<-l.letGo
	l.mu.Lock()
	defer l.mu.Unlock()
	l.acking--
	l.acked = append(l.acked, batchOf(ids[0]))
	return nil, nil
}

// As a stream of the agent gateway sends its next frame before the agent acknowledges the last,
// the in-process agent claims again while a full batch's acknowledgement is written: batches
// are acknowledged one at a time, in the order they were claimed, and no more than claimWindow
// are claimed and unacknowledged.
func TestAgentClaimsAgainWhileItsBatchIsAcknowledged(t *testing.T) {
	l := &pipeLink{claimed: make(chan int), letGo: make(chan struct{}), batches: claimWindow + 2}
	s := New(Config{SiteID: "s"}, l)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan string, (claimWindow+2)*claimBatch)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.serve(ctx, engine.Agent{ID: "a", Kind: "site", SiteID: "s"}, nil, time.Hour, func(_ context.Context, _ engine.Agent, c store.Command) engine.Update {
			ran <- c.ID
			return engine.Update{}
		}, &mortality{fate: func(store.Command) death { return lives }, die: cancel, deaths: new(atomic.Int32)})
	}()
	claim := func(want int) {
		t.Helper()
		select {
		case n := <-l.claimed:
			if n != want {
				t.Fatalf("claim %d, want %d", n, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("claim %d not made", want)
		}
	}
	// Every acknowledgement held: the agent claims until claimWindow batches wait for theirs.
	for n := 1; n <= claimWindow; n++ {
		claim(n)
	}
	select {
	case n := <-l.claimed:
		t.Fatalf("claim %d made with %d batches unacknowledged", n, claimWindow)
	case <-time.After(50 * time.Millisecond):
	}
	if len(ran) != 0 {
		t.Fatalf("%d commands ran before their acknowledgement", len(ran))
	}
	// One acknowledgement returns: its batch runs and one more claim is made.
	l.letGo <- struct{}{}
	claim(claimWindow + 1)
	for range claimBatch {
		select {
		case id := <-ran:
			if batchOf(id) != 1 {
				t.Fatalf("%s ran before its batch was acknowledged", id)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the acknowledged batch did not run")
		}
	}
	for range claimWindow {
		l.letGo <- struct{}{}
	}
	claim(claimWindow + 2)
	l.letGo <- struct{}{}
	claim(claimWindow + 3) // finds none: the agent waits for a wake or its poll
	cancel()
	<-done
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.most != 1 {
		t.Errorf("%d acknowledgements under way at once, want 1", l.most)
	}
	for i, b := range l.acked {
		if b != i+1 {
			t.Fatalf("batches acknowledged in the order %v, want the order they were claimed", l.acked)
		}
	}
	if len(l.acked) != claimWindow+2 {
		t.Errorf("%d batches acknowledged, want %d", len(l.acked), claimWindow+2)
	}
}
