// Package api serves the public API (ConnectRPC: gRPC, gRPC-Web and JSON over HTTP) over the
// metal service: authentication, request limits, strict decoding and error codes live here; the
// verbs live in metal.
package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"bcd/internal/auth"
	"bcd/internal/console"
	"bcd/internal/gen/bcdv1/bcdv1connect"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
	"bcd/internal/wirebound"
)

// MaxRequestBytes bounds a request body.
const MaxRequestBytes = 1 << 20

// MaxDecodedElements bounds what one request may decode to: its messages, map entries and list
// elements (in JSON, its objects, object members and array elements), counted before it is
// decoded (wirebound). 1 MiB of empty strings or labels would otherwise decode to tens of MiB,
// before the caller is even authenticated. The largest request bcd takes is a bulk of
// batch.MaxBulk (10,000) nodes or metal.MaxSelectors selectors; others hold at most 64 MACs,
// labels or firmware components per map or list (TestLargestRequestsAccepted).
const MaxDecodedElements = 1 << 14

// SiteJoiner mints site-agent bootstrap tokens and tells where agents connect.
type SiteJoiner interface {
	CreateSiteJoinToken(ctx context.Context, siteID string, ttl time.Duration) (string, error)
	GatewayURL() string
	CAPEM() []byte
}

// ResultVerifier checks stored node-attested results (the engine) and gives the agent CA they
// chain to.
type ResultVerifier interface {
	VerifyRecorded(c store.Command) error
	CAPEM() []byte
}

// Handler mounts every service on one mux. joiner may be nil (no agent gateway); consoles too
// (then Console answers UNIMPLEMENTED).
func Handler(svc *metal.Service, joiner SiteJoiner, verifier ResultVerifier, consoles *console.Hub, log *slog.Logger) http.Handler {
	authn := &authenticator{svc: svc, ttl: 5 * time.Second, cache: map[string]cachedPrincipal{}}
	opts := []connect.HandlerOption{
		// Every codec Connect would otherwise decode with is replaced: "json; charset=utf-8" is
		// a codec of its own, which WithCodec(json) leaves lax and unbounded.
		connect.WithCodec(wirebound.NewProto(MaxDecodedElements)),
		connect.WithCodec(strictJSON{name: "json", limit: MaxDecodedElements}),
		connect.WithCodec(strictJSON{name: "json; charset=utf-8", limit: MaxDecodedElements}),
		connect.WithReadMaxBytes(MaxRequestBytes),
		// Small answers are cheaper to send than to compress; large ones (listings) are
		// compressed at gzip's fastest level.
		wirebound.Gzip(16 << 10),
		connect.WithInterceptors(authn.interceptor(), logErrors(log)),
	}
	mux := http.NewServeMux()
	n := &nodes{svc: svc, verifier: verifier, consoles: consoles, log: log, names: &nameCache{st: svc.Store(), maxAge: 10 * time.Second}}
	mux.Handle(bcdv1connect.NewNodeServiceHandler(n, opts...))
	mux.Handle(bcdv1connect.NewInventoryServiceHandler(&inventory{svc: svc, joiner: joiner}, opts...))
	mux.Handle(bcdv1connect.NewTokenServiceHandler(&tokens{svc: svc}, opts...))
	mux.Handle(bcdv1connect.NewImageServiceHandler(&images{svc: svc}, opts...))
	mux.Handle(bcdv1connect.NewBatchServiceHandler(&batches{svc: svc, names: n.names}, opts...))
	return mux
}

// strictJSON is the JSON codec with unknown fields refused (connect's default discards them) and
// requests that would decode to more than limit elements refused before they are decoded.
type strictJSON struct {
	name  string // Connect's codec name: json, json; charset=utf-8
	limit int
}

func (c strictJSON) Name() string { return c.name }

func (strictJSON) Marshal(m any) ([]byte, error) {
	msg, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("cannot encode %T as JSON", m)
	}
	return protojson.MarshalOptions{}.Marshal(msg)
}

func (c strictJSON) Unmarshal(b []byte, m any) error {
	msg, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("cannot decode JSON into %T", m)
	}
	if len(b) == 0 {
		return nil
	}
	if _, err := wirebound.CountJSON(b, c.limit); err != nil {
		return fmt.Errorf("JSON request refused before decoding: %w", err)
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(b, msg); err != nil {
		return fmt.Errorf("invalid JSON request: %s", withoutValues(err.Error()))
	}
	return nil
}

// jsonValueRe matches what the JSON decoder quotes of the request after the place and field it
// names: a value of the wrong type, an unexpected token.
var jsonValueRe = regexp.MustCompile(`(invalid value for [a-z0-9]+ field [A-Za-z0-9_]+|unexpected token|invalid value): .*$|(unexpected token|invalid value) .*$`)

// withoutValues drops the request values a JSON decoding error quotes (a credential sent as a
// number must not come back in the error), keeping the position and the field's name.
func withoutValues(msg string) string {
	return jsonValueRe.ReplaceAllString(msg, "$1$2")
}

// ---------------------------------------------------------------- authentication

type cachedPrincipal struct {
	p       auth.Principal
	expires time.Time
}

// authenticator resolves bearer tokens, caching each for a few seconds (a revoked token stops
// working within the TTL on every replica).
type authenticator struct {
	svc   *metal.Service
	ttl   time.Duration
	mu    sync.Mutex
	cache map[string]cachedPrincipal
}

func (a *authenticator) principal(ctx context.Context, header string) (auth.Principal, error) {
	tok, err := auth.ParseBearer(header)
	if err != nil {
		return auth.Principal{}, connect.NewError(connect.CodeUnauthenticated, err)
	}
	key := string(auth.HashToken(tok))
	now := time.Now()
	a.mu.Lock()
	c, ok := a.cache[key]
	a.mu.Unlock()
	if ok && now.Before(c.expires) {
		return c.p, nil
	}
	p, err := a.svc.Authenticate(ctx, tok)
	if errors.Is(err, store.ErrNotFound) {
		return auth.Principal{}, connect.NewError(connect.CodeUnauthenticated, errors.New("unknown or revoked token"))
	}
	if err != nil {
		return auth.Principal{}, connect.NewError(connect.CodeUnavailable, errors.New("checking the token failed; try again"))
	}
	a.mu.Lock()
	if len(a.cache) > 10000 {
		clear(a.cache)
	}
	a.cache[key] = cachedPrincipal{p: p, expires: now.Add(a.ttl)}
	a.mu.Unlock()
	return p, nil
}

// interceptor authenticates every call, unary and streaming (the console's output stream).
func (a *authenticator) interceptor() connect.Interceptor { return authInterceptor{a} }

type authInterceptor struct{ a *authenticator }

func (i authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		p, err := i.a.principal(ctx, req.Header().Get("Authorization"))
		if err != nil {
			return nil, err
		}
		return next(auth.WithPrincipal(ctx, p), req)
	}
}

func (authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		p, err := i.a.principal(ctx, conn.RequestHeader().Get("Authorization"))
		if err != nil {
			return err
		}
		return next(auth.WithPrincipal(ctx, p), conn)
	}
}

func principal(ctx context.Context) auth.Principal {
	p, _ := auth.FromContext(ctx)
	return p
}

// logErrors logs internal errors (never request bodies: they may hold credentials).
func logErrors(log *slog.Logger) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			resp, err := next(ctx, req)
			if err != nil {
				if ce := new(connect.Error); errors.As(err, &ce) && ce.Code() == connect.CodeInternal {
					log.ErrorContext(ctx, "request failed", "procedure", req.Spec().Procedure, "error", ce.Message())
				}
			}
			return resp, err
		}
	}
}

// toConnect maps service errors to API codes.
func toConnect(err error) error {
	if err == nil {
		return nil
	}
	var (
		inv   *metal.InvalidError
		ref   *provision.RefusedError
		forb  *metal.ForbiddenError
		stale *metal.StaleError
		conf  *metal.ConflictError
		cerr  *connect.Error
	)
	switch {
	case errors.As(err, &cerr):
		return err
	case errors.As(err, &inv):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.As(err, &forb):
		return connect.NewError(connect.CodePermissionDenied, err)
	case errors.As(err, &ref), errors.As(err, &conf):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.As(err, &stale), errors.Is(err, store.ErrStale):
		return connect.NewError(connect.CodeAborted, err)
	case errors.Is(err, store.ErrNotFound):
		return connect.NewError(connect.CodeNotFound, err)
	case errors.Is(err, store.ErrConflict):
		return connect.NewError(connect.CodeAlreadyExists, err)
	case errors.Is(err, store.ErrAmbiguous):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, context.Canceled):
		return connect.NewError(connect.CodeCanceled, err)
	case errors.Is(err, context.DeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}
