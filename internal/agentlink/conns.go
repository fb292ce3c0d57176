package agentlink

import (
	"context"
	"net"
	"sync"
)

// connSet holds the gateway connections a link's transports dialled, so that a link that ended
// closes them all. A transport closes only its idle connections (CloseIdleConnections); a
// stream's connection is still busy for a moment after its call was cancelled, and would stay
// open until the transport's idle timeout: an agent that restarts in the same process, as the
// simulated machines' do, would hold its past lives' connections meanwhile.
type connSet struct {
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
}

func newConnSet() *connSet { return &connSet{conns: map[*trackedConn]struct{}{}} }

// dialer wraps dial: each connection is recorded until it is closed. A dial after closeAll
// fails.
func (s *connSet) dialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, set: s}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			return nil, net.ErrClosed
		}
		s.conns[tc] = struct{}{}
		s.mu.Unlock()
		return tc, nil
	}
}

// closeAll closes every connection still open, and any dialled after.
func (s *connSet) closeAll() {
	s.mu.Lock()
	conns := s.conns
	s.conns, s.closed = map[*trackedConn]struct{}{}, true
	s.mu.Unlock()
	for c := range conns {
		_ = c.Conn.Close()
	}
}

// trackedConn leaves its set when closed.
type trackedConn struct {
	net.Conn
	set  *connSet
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.conns, c)
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}
