// Package console pairs operators' serial-console sessions with the site agents that relay them
// (DESIGN §5 "console"). An operator opens a session on a node (the API's Console call): the
// control plane queues a bmc.console command for a site agent of the node's site and opens a
// Session here, under the command's id. The agent that runs the command dials the gateway's
// Console stream naming that id, and the gateway attaches it (Hub.Attach): from then on what the
// machine writes flows to the operator's stream and what the operator types flows to the agent.
// Either side's end ends the session: the operator's stream ending closes it (the agent is told,
// deactivates the BMC's payload and reports the command done); the agent's stream ending (the
// BMC's session gone) ends the operator's stream with the reason.
//
// A session lives in the memory of the server that opened it: the agent's stream and the
// operator's input must reach that server (docs/operations.md, "Serial console").
package console

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Errors.
var (
	ErrNoSession = errors.New("no console session open on this server under that id")
	ErrAttached  = errors.New("the console session already has its site agent")
	ErrReadOnly  = errors.New("the console session was opened read-only: it takes no input")
	ErrClosed    = errors.New("the console session is closed")
)

// outputDepth is the machine's output chunks buffered for a slow operator (then the agent's
// stream waits: flow control reaches the BMC's session); inputDepth the operator's writes
// buffered for the agent.
const (
	outputDepth = 64
	inputDepth  = 16
)

// Info names a session.
type Info struct {
	ID       string // the bmc.console command's id
	NodeID   string
	TenantID string
	Owner    string // the API token that opened it: only it may type into it
	ReadOnly bool
}

// Hub holds the console sessions open on this server. Safe for concurrent use.
type Hub struct {
	server   string // the server's id (engine.Engine.ID): its sessions' commands name it
	mu       sync.Mutex
	sessions map[string]*Session
	added    chan struct{} // closed and replaced whenever a session is opened
}

// NewHub returns an empty hub of the server named server (the engine's id: a session's
// bmc.console command names it, so that only agents connected to this server take it).
func NewHub(server string) *Hub {
	return &Hub{server: server, sessions: map[string]*Session{}, added: make(chan struct{})}
}

// Server is the id of the server whose sessions the hub holds.
func (h *Hub) Server() string { return h.server }

// Session is one open console session.
type Session struct {
	Info
	hub *Hub

	in       chan []byte   // operator → machine
	out      chan []byte   // machine → operator
	attached chan struct{} // closed when the agent attached
	closed   chan struct{} // closed when the operator's side ended (Close)
	ended    chan struct{} // closed when the agent's side ended (AgentEnd.End)

	attachOnce, closeOnce, endOnce sync.Once
	mu                             sync.Mutex
	agent                          string
	endErr                         error

	bytesIn, bytesOut atomic.Int64
}

// Open opens a session under info.ID.
func (h *Hub) Open(info Info) (*Session, error) {
	if info.ID == "" || info.NodeID == "" {
		return nil, errors.New("opening a console session: the command and node ids are required")
	}
	s := &Session{Info: info, hub: h, in: make(chan []byte, inputDepth), out: make(chan []byte, outputDepth),
		attached: make(chan struct{}), closed: make(chan struct{}), ended: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.sessions[info.ID]; ok {
		return nil, fmt.Errorf("opening console session %s: it is open already", info.ID)
	}
	h.sessions[info.ID] = s
	close(h.added)
	h.added = make(chan struct{})
	return s, nil
}

// Count is the number of sessions open.
func (h *Hub) Count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sessions)
}

// Lookup returns the open session id.
func (h *Hub) Lookup(id string) (*Session, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.sessions[id]
	return s, ok
}

// IDs lists the open sessions' ids, sorted.
func (h *Hub) IDs() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, 0, len(h.sessions))
	for id := range h.sessions {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Close ends the operator's side: the agent's stream is told (AgentEnd.Closed) and the session
// leaves the hub. Idempotent.
func (s *Session) Close() {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.hub.mu.Lock()
		if s.hub.sessions[s.ID] == s {
			delete(s.hub.sessions, s.ID)
		}
		s.hub.mu.Unlock()
	})
}

// Attached is closed once a site agent attached.
func (s *Session) Attached() <-chan struct{} { return s.attached }

// Agent is the id of the site agent attached ("" before).
func (s *Session) Agent() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.agent
}

// Output yields what the machine wrote, in order.
func (s *Session) Output() <-chan []byte { return s.out }

// Ended is closed once the agent's side ended; Err then says why (nil: it ended because the
// operator closed the session, or the agent's command reached its end normally).
func (s *Session) Ended() <-chan struct{} { return s.ended }

// Err is the reason the agent's side ended.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endErr
}

// Bytes counts what crossed the session: typed in, written out.
func (s *Session) Bytes() (in, out int64) { return s.bytesIn.Load(), s.bytesOut.Load() }

// Input queues data (copied) for the machine. It waits while the agent is behind, until ctx ends.
func (s *Session) Input(ctx context.Context, data []byte) error {
	if s.ReadOnly {
		return ErrReadOnly
	}
	select {
	case <-s.closed:
		return ErrClosed
	case <-s.ended:
		return ErrClosed
	default:
	}
	select {
	case s.in <- slices.Clone(data):
		s.bytesIn.Add(int64(len(data)))
		return nil
	case <-s.closed:
		return ErrClosed
	case <-s.ended:
		return ErrClosed
	case <-ctx.Done():
		return fmt.Errorf("the console did not take the input: %w", ctx.Err())
	}
}

// AgentEnd is the site agent's side of a session.
type AgentEnd struct{ s *Session }

// Attach gives agentID the session id, waiting until ctx ends for the operator's side to be
// opened (the agent may run the command a moment before the server that queued it opened it).
// A session has one agent: a second attach is ErrAttached.
func (h *Hub) Attach(ctx context.Context, id, agentID string) (*AgentEnd, error) {
	for {
		h.mu.Lock()
		s, ok := h.sessions[id]
		added := h.added
		h.mu.Unlock()
		if ok {
			first := false
			s.attachOnce.Do(func() {
				first = true
				s.mu.Lock()
				s.agent = agentID
				s.mu.Unlock()
				close(s.attached)
			})
			if !first {
				return nil, ErrAttached
			}
			return &AgentEnd{s: s}, nil
		}
		select {
		case <-added:
		case <-ctx.Done():
			return nil, ErrNoSession
		}
	}
}

// Input yields what the operator typed, in order.
func (a *AgentEnd) Input() <-chan []byte { return a.s.in }

// Closed is closed when the operator's side ended.
func (a *AgentEnd) Closed() <-chan struct{} { return a.s.closed }

// Output passes data (copied) to the operator, waiting while the operator is behind, until ctx
// ends or the operator's side closes.
func (a *AgentEnd) Output(ctx context.Context, data []byte) error {
	select {
	case <-a.s.closed:
		return ErrClosed
	default:
	}
	select {
	case a.s.out <- slices.Clone(data):
		a.s.bytesOut.Add(int64(len(data)))
		return nil
	case <-a.s.closed:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// End ends the agent's side with why (nil: a normal end). Idempotent: the first reason stays.
func (a *AgentEnd) End(why error) {
	a.s.endOnce.Do(func() {
		a.s.mu.Lock()
		a.s.endErr = why
		a.s.mu.Unlock()
		close(a.s.ended)
	})
}

// ErrEnded: the agent's side of the session ended (wrapped with its reason, if any).
var ErrEnded = errors.New("the console session ended")

// Next returns the machine's next output, waiting until there is some, ctx ends, or the agent's
// side ended and everything it passed was taken (then ErrEnded, wrapping the reason).
func (s *Session) Next(ctx context.Context) ([]byte, error) {
	select {
	case b := <-s.out:
		return b, nil
	default:
	}
	select {
	case b := <-s.out:
		return b, nil
	case <-s.ended:
		select {
		case b := <-s.out:
			return b, nil
		default:
		}
		if err := s.Err(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrEnded, err)
		}
		return nil, ErrEnded
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Sender is where Serve sends the operator's side of a session: status lines and the machine's
// output.
type Sender interface {
	Status(s string) error
	Data(b []byte) error
}

// ErrNoAgent: no site agent attached to the session within Serve's wait.
var ErrNoAgent = errors.New("no site agent took the console")

// Serve runs the operator's side of session s until it ends: it tells the operator it waits
// for a site agent, then which agent relays it, then passes what the machine writes, and last
// why the session ended. It returns why it ended, as the session's closing event records it,
// and an error when the operator's side failed or no agent attached within wait (ErrNoAgent).
// The caller closes the session afterwards.
func (s *Session) Serve(ctx context.Context, wait time.Duration, out Sender) (why string, err error) {
	if err := out.Status("waiting for a site agent of the node's site"); err != nil {
		return "the operator's stream failed", err
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-s.Attached():
	case <-s.Ended():
	case <-timer.C:
		return "no site agent took it", ErrNoAgent
	case <-ctx.Done():
		return "closed by the operator", ctx.Err()
	}
	if a := s.Agent(); a != "" {
		if err := out.Status("connected through site agent " + a); err != nil {
			return "the operator's stream failed", err
		}
	}
	for {
		b, err := s.Next(ctx)
		switch {
		case errors.Is(err, ErrEnded):
			return err.Error(), out.Status("closed: " + err.Error())
		case err != nil:
			return "closed by the operator", err
		}
		if err := out.Data(b); err != nil {
			return "the operator's stream failed", err
		}
	}
}

// ErrServerStopping ends the sessions of a server that stops (Hub.Shutdown).
var ErrServerStopping = errors.New("the server is stopping")

// Shutdown ends every open session as its agent's side ending would, with ErrServerStopping:
// each operator is told, and each session's handler returns (its close then tells the agent).
func (h *Hub) Shutdown() {
	h.mu.Lock()
	open := make([]*Session, 0, len(h.sessions))
	for _, s := range h.sessions {
		open = append(open, s)
	}
	h.mu.Unlock()
	for _, s := range open {
		(&AgentEnd{s: s}).End(ErrServerStopping)
	}
}
