package gateway

import (
	"crypto/tls"
	"net"
	"net/http"
	"sync/atomic"

	"bcd/internal/pki"
)

// Stats are counts of what a gateway served since it started (Server.Stats): its connections,
// the agents that joined and held streams, and the work that crossed them. An operator reads
// them from the server's /metrics to see the fleet arrive, stay and leave, and to tell a bad
// certificate or a token guesser from a quiet site.
type Stats struct {
	// Connections are the TCP connections the gateway accepted, OpenConnections those open now,
	// and TLSFailures those that closed before their TLS handshake completed (a certificate
	// the gateway's CAs did not sign, an expired one, a client that is not an agent).
	Connections, OpenConnections, TLSFailures int64
	// Joins are the joins that got a certificate, by the kind of agent ("site-agent", "node":
	// a ramdisk or an installed OS), and JoinsRefused those that did not (a token unknown,
	// used or expired; a bad request; the store out).
	Joins        map[string]int64
	JoinsRefused int64
	// Streams are the agents' streams open now and StreamsOpened those admitted so far, by the
	// kind of their certificate ("site-agent", "node", "node-tenant"); StreamsRefused were
	// not admitted (a revoked site agent or identity generation, an unknown node, a
	// certificate of another kind).
	Streams, StreamsOpened map[string]int64
	StreamsRefused         int64
	// CommandsSent are the commands sent down streams, and Updates the command updates
	// agents sent up (progress and results).
	CommandsSent, Updates int64
}

// kindCount is a count per certificate kind, indexed by pki.Kind.
type kindCount [pki.KindServer + 1]atomic.Int64

// agentKinds are the kinds of certificate an agent holds; a join gives the first two (an
// installed OS joins as a node).
var agentKinds = []pki.Kind{pki.KindSiteAgent, pki.KindNode, pki.KindNodeTenant}

// byName returns the counts of these kinds by name, zeros included.
func (k *kindCount) byName(kinds []pki.Kind) map[string]int64 {
	out := make(map[string]int64, len(kinds))
	for _, kind := range kinds {
		out[kind.String()] = k[kind].Load()
	}
	return out
}

func (k *kindCount) add(kind pki.Kind, n int64) {
	if int(kind) < len(k) {
		k[kind].Add(n)
	}
}

// counters are a Server's Stats as they are kept.
type counters struct {
	conns, open, tlsFailures atomic.Int64
	joins                    kindCount
	joinsRefused             atomic.Int64
	streams, streamsOpened   kindCount
	streamsRefused           atomic.Int64
	commandsSent, updates    atomic.Int64
}

// Stats reads the gateway's counts.
func (s *Server) Stats() Stats {
	c := &s.counts
	return Stats{
		Connections: c.conns.Load(), OpenConnections: c.open.Load(), TLSFailures: c.tlsFailures.Load(),
		Joins: c.joins.byName(agentKinds[:2]), JoinsRefused: c.joinsRefused.Load(),
		Streams: c.streams.byName(agentKinds), StreamsOpened: c.streamsOpened.byName(agentKinds), StreamsRefused: c.streamsRefused.Load(),
		CommandsSent: c.commandsSent.Load(), Updates: c.updates.Load(),
	}
}

// connState counts a connection's arrival and departure (http.Server.ConnState). One that
// closes before its TLS handshake completed is a TLS failure: the server closes a connection
// whose handshake failed without another word.
func (c *counters) connState(conn net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		c.conns.Add(1)
		c.open.Add(1)
	case http.StateHijacked:
		c.open.Add(-1)
	case http.StateClosed:
		c.open.Add(-1)
		if tc, ok := conn.(*tls.Conn); ok && !tc.ConnectionState().HandshakeComplete {
			c.tlsFailures.Add(1)
		}
	}
}
