// Package webui serves the operator's web UI at /ui/ on the API listener: server-rendered HTML
// (templ) with htmx for live refresh. Every view and action calls the metal service in-process
// as the API does, with the principal of the caller's bearer token: roles and tenants are the
// service's checks, not the UI's.
package webui

import (
	"context"
	"embed"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/a-h/templ"

	"bcd/internal/auth"
	"bcd/internal/console"
	"bcd/internal/metal"
	"bcd/internal/store"
)

//go:generate go tool templ generate

//go:embed static
var staticFiles embed.FS

// Verifier checks a stored node-attested result (the engine); nil lists them unverified.
type Verifier interface {
	VerifyRecorded(c store.Command) error
}

// Config is what the UI needs.
type Config struct {
	Service *metal.Service
	// Verifier checks attestations (optional).
	Verifier Verifier
	// Secure marks the session cookie Secure: the listener is TLS.
	Secure bool
	Log    *slog.Logger
	// Consoles holds the operators' console sessions (the API's hub); nil: no console page.
	Consoles *console.Hub
}

// UI is the web UI's handler.
type UI struct {
	svc      *metal.Service
	consoles *console.Hub
	verifier Verifier
	secure   bool
	log      *slog.Logger
	mux      *http.ServeMux
}

// Prefix is where the UI is mounted.
const Prefix = "/ui/"

// New builds the UI.
func New(cfg Config) *UI {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	u := &UI{svc: cfg.Service, consoles: cfg.Consoles, verifier: cfg.Verifier, secure: cfg.Secure, log: log, mux: http.NewServeMux()}
	static, err := fs.Sub(staticFiles, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	u.mux.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", staticHandler(http.FileServerFS(static))))
	u.mux.HandleFunc("GET /ui/login", u.loginPage)
	u.mux.HandleFunc("POST /ui/login", u.login)
	u.mux.HandleFunc("POST /ui/logout", u.authed(u.logout))
	u.mux.HandleFunc("GET /ui/{$}", u.authed(u.dashboard))
	u.mux.HandleFunc("GET /ui/nodes", u.authed(u.nodeList))
	u.mux.HandleFunc("GET /ui/nodes/{ref}", u.authed(u.nodeDetail))
	u.mux.HandleFunc("POST /ui/nodes/{ref}/verb/{verb}", u.authed(u.nodeVerb))
	u.mux.HandleFunc("GET /ui/nodes/{ref}/console", u.authed(u.consolePage))
	u.mux.HandleFunc("GET /ui/nodes/{ref}/console/stream", u.authedFor(0, u.consoleStream))
	u.mux.HandleFunc("POST /ui/nodes/{ref}/console/input", u.authed(u.consoleInput))
	u.mux.HandleFunc("GET /ui/batches", u.authed(u.batchList))
	u.mux.HandleFunc("GET /ui/batches/{id}", u.authed(u.batchDetail))
	u.mux.HandleFunc("POST /ui/batches/{id}/{action}", u.authed(u.batchDecide))
	u.mux.HandleFunc("GET /ui/events", u.authed(u.eventsPage))
	u.mux.HandleFunc("GET /ui/events/rows", u.authed(u.eventRows))
	u.mux.HandleFunc("/ui/", func(w http.ResponseWriter, r *http.Request) {
		u.fail(w, r, nil, http.StatusNotFound, "no such page: "+r.URL.Path)
	})
	return u
}

// ServeHTTP sets the security headers of every UI response, then serves it.
func (u *UI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w.Header())
	u.mux.ServeHTTP(w, r)
}

// Redirect answers /ui with /ui/ (the cookie's path).
func Redirect(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w.Header())
	http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
}

// contentSecurityPolicy allows the UI's own script and style only: no inline script or style,
// no framing, forms posted to the UI only.
const contentSecurityPolicy = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"

func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
}

// staticHandler serves the embedded files, not their directory's listing, and lets browsers
// keep them, checking back each time (they change with the binary, and their names do not).
func staticHandler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "no-cache")
		next.ServeHTTP(w, r)
	})
}

// session is an authenticated request's caller.
type session struct {
	p     auth.Principal
	csrf  string // the CSRF token of the session's forms
	fresh bool   // the request came from htmx (HX-Request): answer a fragment
}

type handler func(w http.ResponseWriter, r *http.Request, s session)

// authed resolves the session cookie to its principal (on every request: a revoked token stops
// at once) and checks POSTs for their CSRF token and origin. Without a valid session the
// browser goes to the login page.
func (u *UI) authed(h handler) http.HandlerFunc { return u.authedFor(10*time.Second, h) }

// authedFor is authed with the request's time bound (0: none, a stream that lasts as long as
// its page: the console's).
func (u *UI) authedFor(bound time.Duration, h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, ok := sessionToken(r)
		if !ok {
			u.toLogin(w, r, "")
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		if bound > 0 {
			ctx, cancel = context.WithTimeout(r.Context(), bound)
		}
		defer cancel()
		p, err := u.svc.Authenticate(ctx, tok)
		if errors.Is(err, store.ErrNotFound) {
			u.clearCookie(w)
			u.toLogin(w, r, msgRevoked)
			return
		}
		if err != nil {
			u.log.ErrorContext(ctx, "web UI: checking a session's token", "error", err)
			u.fail(w, r, nil, http.StatusServiceUnavailable, "checking the session's token failed; try again")
			return
		}
		s := session{p: p, csrf: csrfToken(tok), fresh: r.Header.Get("HX-Request") == "true"}
		if r.Method == http.MethodPost {
			r.Body = http.MaxBytesReader(w, r.Body, maxForm)
			if msg := checkPost(r, s.csrf); msg != "" {
				u.fail(w, r, &s, http.StatusForbidden, msg)
				return
			}
		}
		h(w, r.WithContext(ctx), s)
	}
}

// toLogin sends the browser to the login page with one of the login page's messages; an htmx
// request (a live refresh) is told to load the page itself rather than swap it into a table.
func (u *UI) toLogin(w http.ResponseWriter, r *http.Request, msg string) {
	target := "/ui/login"
	if msg != "" {
		target += "?m=" + msg
	}
	if r.Header.Get("HX-Request") == "true" {
		w.Header().Set("HX-Redirect", target)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	http.Redirect(w, r, target, http.StatusSeeOther)
}

// render writes a page or fragment.
func (u *UI) render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	if err := c.Render(r.Context(), w); err != nil {
		u.log.DebugContext(r.Context(), "web UI: writing a page", "path", r.URL.Path, "error", err)
	}
}
