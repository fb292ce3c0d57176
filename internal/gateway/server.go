package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"

	agentv1 "bcd/internal/gen/agentv1"
	"bcd/internal/gen/agentv1/agentv1connect"
	"bcd/internal/pki"
	"bcd/internal/wirebound"
)

// MaxJoinBytes bounds a Join request (a token, a CSR and a few hints).
const MaxJoinBytes = 64 << 10

// CompressMinBytes is the smallest message the gateway compresses for an agent that accepts
// gzip: a smaller one goes as it is. What it compresses it compresses at gzip's best speed.
// From 1 KiB a join's answer (a certificate and the CA's, about 1.1 KiB) was compressed, by an
// eighth, for 1.4 % of the server's processor time over the gateway; a site agent's batch of
// commands, tens of KiB of repeated field names and addresses, still is.
const CompressMinBytes = 4 << 10

// Server implements bcd.agent.v1.GatewayService.
type Server struct {
	cfg    Config
	counts counters
}

var _ agentv1connect.GatewayServiceHandler = (*Server)(nil)

// New checks cfg and fills in its defaults.
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg}, nil
}

// Handler serves GatewayService at its path (mount it at "/" or at the returned path). It must
// be reached over TLS: the peer's verified certificate is the only credential of Connect.
func (s *Server) Handler() (string, http.Handler) {
	// Messages are decoded only when they decode to at most MaxDecodedElements elements, and
	// only from binary protobuf (codecs).
	codecs := connect.WithHandlerOptions(connect.WithCodec(wirebound.NewProto(MaxDecodedElements)),
		connect.WithCodec(noJSON{name: "json"}), connect.WithCodec(noJSON{name: "json; charset=utf-8"}),
		wirebound.Gzip(CompressMinBytes))
	path, h := agentv1connect.NewGatewayServiceHandler(s,
		connect.WithReadMaxBytes(s.cfg.MaxMessageBytes), codecs,
	)
	// Join needs no client certificate: anyone who reaches the gateway may call it, so its
	// request is held to what a join carries (a token, a CSR, a few hints).
	_, join := agentv1connect.NewGatewayServiceHandler(s, connect.WithReadMaxBytes(MaxJoinBytes), codecs)
	mux := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == agentv1connect.GatewayServiceJoinProcedure || !verifiedClient(r.TLS):
			// Every other call refuses a caller without a verified client certificate, but
			// Connect reads a unary request whole before the handler runs: without this bound
			// anyone could make the gateway read and hold MaxMessageBytes per request.
			r.Body = http.MaxBytesReader(w, r.Body, MaxJoinBytes)
			join.ServeHTTP(w, withRequestState(r, nil))
		case r.URL.Path == agentv1connect.GatewayServiceConnectProcedure:
			body := &streamBody{ReadCloser: r.Body}
			r.Body = body
			h.ServeHTTP(w, withRequestState(r, body))
		default:
			h.ServeHTTP(w, withRequestState(r, nil))
		}
	})
	return path, mux
}

// verifiedClient says whether the connection's handshake verified a client certificate.
func verifiedClient(st *tls.ConnectionState) bool {
	return st != nil && len(st.VerifiedChains) > 0 && len(st.VerifiedChains[0]) > 0
}

// requestStateKey carries a request's requestState into connect handlers, whose Peer() does
// not expose the TLS state.
type requestStateKey struct{}

type requestState struct {
	tls  *tls.ConnectionState
	body *streamBody // a Connect stream's request body; nil for the other calls
}

func withRequestState(r *http.Request, body *streamBody) *http.Request {
	if r.TLS == nil && body == nil {
		return r
	}
	return r.WithContext(context.WithValue(r.Context(), requestStateKey{}, &requestState{tls: r.TLS, body: body}))
}

// tlsState is the request's verified TLS state (nil: none).
func tlsState(ctx context.Context) *tls.ConnectionState {
	if st, _ := ctx.Value(requestStateKey{}).(*requestState); st != nil {
		return st.tls
	}
	return nil
}

// peerIdentity is the identity of the request's verified client certificate, refused if the
// certificate is not valid now: a connection keeps the certificate of its handshake, so
// one opened before the certificate expired (an agent since renewed, or one left running
// past its certificate's end) would otherwise carry it for as long as it stays open.
func (s *Server) peerIdentity(ctx context.Context) (pki.Identity, error) {
	st := tlsState(ctx)
	id, ok := pki.IdentityFromTLS(st)
	if !ok {
		return pki.Identity{}, connect.NewError(connect.CodeUnauthenticated, errors.New("a client certificate issued at join is required"))
	}
	leaf := st.VerifiedChains[0][0]
	if now := s.cfg.Now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		err := connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%s: %w: the certificate this connection presented is valid from %s to %s, and it is %s (an agent that renewed its certificate must connect again)",
			id, pki.ErrCertExpired, leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339)))
		err.Meta().Set(pki.RefusalHeader, pki.RefusalCertExpired)
		return pki.Identity{}, err
	}
	// The handshake verified it against the CAs trusted then; a rotation finished since may have
	// retired its issuer. (The parsed leaf: the CA keeps it, not a second parse, while the
	// connection holds it anyway.)
	if _, _, err := s.cfg.CA.VerifyCert(leaf, s.cfg.Now()); errors.Is(err, pki.ErrUnknownCA) {
		return pki.Identity{}, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("%s: %w: its CA is no longer trusted (the agent CA was rotated): the agent must join again", id, pki.ErrUnknownCA))
	}
	return id, nil
}

// Join exchanges a one-time token and a CSR for a certificate.
func (s *Server) Join(ctx context.Context, req *connect.Request[agentv1.JoinRequest]) (_ *connect.Response[agentv1.JoinResponse], joinErr error) {
	m := req.Msg
	// Every join is counted once, by its outcome: a certificate of its kind, or a refusal.
	defer func() {
		switch {
		case joinErr != nil:
			s.counts.joinsRefused.Add(1)
		case m.GetKind() == agentv1.AgentKind_AGENT_KIND_SITE:
			s.counts.joins.add(pki.KindSiteAgent, 1)
		default:
			s.counts.joins.add(pki.KindNode, 1)
		}
	}()
	if m.GetToken() == "" {
		return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("a join token is required"))
	}
	if len(m.GetCsrDer()) == 0 {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a certificate request (csr_der) is required"))
	}
	var (
		der []byte
		err error
	)
	switch m.GetKind() {
	case agentv1.AgentKind_AGENT_KIND_SITE:
		der, err = s.cfg.Identities.JoinSite(ctx, m.GetToken(), m.GetCsrDer())
	case agentv1.AgentKind_AGENT_KIND_NODE:
		der, err = s.cfg.Identities.JoinNode(ctx, m.GetToken(), m.GetCsrDer(), hintsOf(m.GetHints()))
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unknown agent kind %v", m.GetKind()))
	}
	switch {
	case err == nil:
	case errors.Is(err, ErrTokenRefused):
		// One answer for unknown, used and expired tokens: no oracle for a token guesser.
		s.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "agent join refused", slog.String("kind", m.GetKind().String()), slog.String("peer", req.Peer().Addr))
		return nil, connect.NewError(connect.CodeUnauthenticated, ErrTokenRefused)
	case errors.Is(err, pki.ErrBadCSR):
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	default:
		s.cfg.Logger.LogAttrs(ctx, slog.LevelError, "agent join failed", slog.String("kind", m.GetKind().String()), slog.Any("error", err))
		return nil, connect.NewError(connect.CodeInternal, errors.New("join failed"))
	}
	return connect.NewResponse(&agentv1.JoinResponse{CertDer: der, CaPem: s.cfg.CA.CertPEM()}), nil
}

// Renew certifies the caller's identity and key again, for an agent whose certificate is due
// for renewal (see the proto). The caller's identity is admitted as for Connect.
func (s *Server) Renew(ctx context.Context, _ *connect.Request[agentv1.RenewRequest]) (*connect.Response[agentv1.RenewResponse], error) {
	if _, err := s.admit(ctx); err != nil {
		return nil, err
	}
	st := tlsState(ctx)
	id, _ := pki.IdentityFromTLS(st) // admit found it
	der, err := s.cfg.Identities.Renew(ctx, id, st.PeerCertificates[0].Raw)
	switch {
	case err == nil:
	case errors.Is(err, pki.ErrIdentityRevoked), errors.Is(err, ErrNotFound), errors.Is(err, pki.ErrBadIdentity):
		return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s: %w", id, err))
	default:
		s.cfg.Logger.LogAttrs(ctx, slog.LevelError, "renewing an agent certificate", slog.String("agent", id.String()), slog.Any("error", err))
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("cannot renew the certificate now"))
	}
	return connect.NewResponse(&agentv1.RenewResponse{CertDer: der, CaPem: s.cfg.CA.CertPEM()}), nil
}

// admit decides whether a verified identity may hold a Connect stream.
func (s *Server) admit(ctx context.Context) (AgentRef, error) {
	id, err := s.peerIdentity(ctx)
	if err != nil {
		return AgentRef{}, err
	}
	switch id.Kind {
	case pki.KindSiteAgent:
		if err := s.siteAgentAllowed(ctx, id); err != nil {
			return AgentRef{}, err
		}
	case pki.KindNode, pki.KindNodeTenant:
		cur, err := s.cfg.Identities.CurrentGeneration(ctx, id.NodeID)
		if errors.Is(err, ErrNotFound) {
			return AgentRef{}, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s: unknown node", id))
		}
		if err != nil {
			s.cfg.Logger.LogAttrs(ctx, slog.LevelError, "reading node identity generation", slog.String("agent", id.String()), slog.Any("error", err))
			return AgentRef{}, connect.NewError(connect.CodeUnavailable, errors.New("cannot check the identity generation now"))
		}
		if cur != id.Generation {
			return AgentRef{}, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s: %w (current generation %d)", id, pki.ErrIdentityRevoked, cur))
		}
	default:
		return AgentRef{}, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("a %s certificate cannot connect as an agent", id.Kind))
	}
	return RefOf(id), nil
}

// siteAgentAllowed refuses a site agent whose certificate an operator revoked.
func (s *Server) siteAgentAllowed(ctx context.Context, id pki.Identity) error {
	revoked, err := s.cfg.Identities.SiteAgentRevoked(ctx, id.AgentID)
	if err != nil {
		s.cfg.Logger.LogAttrs(ctx, slog.LevelError, "reading whether a site agent is revoked", slog.String("agent", id.String()), slog.Any("error", err))
		return connect.NewError(connect.CodeUnavailable, errors.New("cannot check the agent's certificate now"))
	}
	if revoked {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s: %w", id, ErrAgentRevoked))
	}
	return nil
}

// ServeTLS serves h (normally the gateway's Handler) over HTTP/2 with TLS 1.3 on ln until ctx
// ends, with cert's current certificate (renewed while it serves). Client certificates are
// verified against the CA when presented (pki.ServerTLSConfig). Handlers' contexts end with
// ctx, so long-lived streams close at shutdown.
func ServeTLS(ctx context.Context, ln net.Listener, cert *pki.ServerCert, h http.Handler, log *slog.Logger) error {
	return serveTLS(ctx, ln, cert, h, log, nil)
}

// Serve is ServeTLS counting the connections in the gateway's Stats: h is the gateway's
// Handler, or a handler around it.
func (s *Server) Serve(ctx context.Context, ln net.Listener, cert *pki.ServerCert, h http.Handler, log *slog.Logger) error {
	return serveTLS(ctx, ln, cert, h, log, s.counts.connState)
}

func serveTLS(ctx context.Context, ln net.Listener, cert *pki.ServerCert, h http.Handler, log *slog.Logger, connState func(net.Conn, http.ConnState)) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg := cert.TLSConfig()
	cfg.NextProtos = []string{"h2"} // as http.Server sets it: handshakes get copies of cfg
	var protos http.Protocols
	protos.SetHTTP2(true)
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         cfg,
		Protocols:         &protos,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState:         connState,
		HTTP2: &http.HTTP2Config{
			MaxConcurrentStreams: 256,
			// Dead peers (power loss, NAT timeout) are found by HTTP/2 pings.
			SendPingTimeout: 30 * time.Second,
			PingTimeout:     15 * time.Second,
			// A connection keeps a buffer as large as the largest frame it read for as long as
			// it stays open (thousands of them, most idle): frames of the protocol's least
			// maximum, 16 KiB, not 1 MiB. Messages are bounded by MaxMessageBytes alone.
			MaxReadFrameSize: 16 << 10,
			// An agent's connection carries one long stream: the response headers it would
			// index for later responses are never used again, yet kept while it stays open.
			MaxEncoderHeaderTableSize: 1,
		},
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
		case <-done:
			return
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
	}()
	err := srv.ServeTLS(ln, "", "")
	close(done)
	<-stopped
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serving agent gateway on %s: %w", ln.Addr(), err)
}
