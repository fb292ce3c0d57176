package console

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestHubPairsAndEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := NewHub("")

	// An agent that comes first waits for the operator's side to open.
	attached := make(chan *AgentEnd, 1)
	go func() {
		a, err := h.Attach(ctx, "c1", "agent-1")
		if err != nil {
			t.Error(err)
		}
		attached <- a
	}()
	s, err := h.Open(Info{ID: "c1", NodeID: "n1", Owner: "tok"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Open(Info{ID: "c1", NodeID: "n1"}); err == nil {
		t.Error("a second session under one id was opened")
	}
	a := <-attached
	<-s.Attached()
	if s.Agent() != "agent-1" || h.Count() != 1 {
		t.Fatalf("agent %q, %d sessions", s.Agent(), h.Count())
	}
	if _, err := h.Attach(ctx, "c1", "agent-2"); !errors.Is(err, ErrAttached) {
		t.Errorf("second attach: %v", err)
	}

	// Output in order, also what was passed just before the agent's end.
	for _, b := range []string{"a", "b", "c"} {
		if err := a.Output(ctx, []byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Input(ctx, []byte("typed")); err != nil {
		t.Fatal(err)
	}
	if got := <-a.Input(); string(got) != "typed" {
		t.Errorf("input %q", got)
	}
	a.End(errors.New("BMC gone"))
	var got string
	for {
		b, err := s.Next(ctx)
		if err != nil {
			if !errors.Is(err, ErrEnded) || err.Error() != "the console session ended: BMC gone" {
				t.Errorf("end: %v", err)
			}
			break
		}
		got += string(b)
	}
	if got != "abc" {
		t.Errorf("output %q, want abc", got)
	}
	if err := s.Input(ctx, []byte("late")); !errors.Is(err, ErrClosed) {
		t.Errorf("input after the end: %v", err)
	}
	if in, out := s.Bytes(); in != 5 || out != 3 {
		t.Errorf("bytes %d in, %d out", in, out)
	}

	// The operator's close reaches the agent and frees the id.
	s.Close()
	select {
	case <-a.Closed():
	default:
		t.Error("agent not told of the close")
	}
	if err := a.Output(ctx, []byte("x")); !errors.Is(err, ErrClosed) {
		t.Errorf("output after close: %v", err)
	}
	if h.Count() != 0 {
		t.Errorf("%d sessions after close", h.Count())
	}
	if _, ok := h.Lookup("c1"); ok {
		t.Error("closed session still found")
	}

	// An agent for a session never opened gives up with its context.
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	if _, err := h.Attach(short, "nope", "agent-1"); !errors.Is(err, ErrNoSession) {
		t.Errorf("attach to nothing: %v", err)
	}
}

func TestHubReadOnlyAndBackpressure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := NewHub("")
	ro, _ := h.Open(Info{ID: "r", NodeID: "n", ReadOnly: true})
	if err := ro.Input(ctx, []byte("x")); !errors.Is(err, ErrReadOnly) {
		t.Errorf("read-only input: %v", err)
	}
	s, _ := h.Open(Info{ID: "w", NodeID: "n"})
	// Nobody reads the input: it waits, then gives up with its context, nothing lost silently.
	for i := 0; i < inputDepth; i++ {
		if err := s.Input(ctx, []byte("k")); err != nil {
			t.Fatal(err)
		}
	}
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	if err := s.Input(short, []byte("k")); err == nil {
		t.Error("input beyond the buffer with nobody reading was taken")
	}
}

// A stopping server ends its sessions: each operator's Serve returns, told why.
func TestHubShutdown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := NewHub("")
	s, _ := h.Open(Info{ID: "c", NodeID: "n"})
	if _, err := h.Attach(ctx, "c", "a"); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() {
		why, _ := s.Serve(ctx, time.Minute, discard{})
		done <- why
	}()
	h.Shutdown()
	select {
	case why := <-done:
		if !strings.Contains(why, "the server is stopping") {
			t.Errorf("ended: %q", why)
		}
	case <-ctx.Done():
		t.Fatal("Serve did not return when the server stopped")
	}
}

type discard struct{}

func (discard) Status(string) error { return nil }
func (discard) Data([]byte) error   { return nil }
