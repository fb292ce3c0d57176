// Package redfish is the Redfish BMC driver of the site agent, on gofish: power, boot override
// (with read-back), out-of-band inventory, virtual media and credential rotation.
package redfish

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"bcd/internal/bmc"

	"github.com/stmcginnis/gofish"
	"github.com/stmcginnis/gofish/schemas"
)

// Options tune the driver; the zero value is usable.
type Options struct {
	// BasicAuth skips session login (some BMCs run out of sessions).
	BasicAuth bool
	// Retries of transient BMC errors: waits grow from BackoffInitial (default 500 ms) to
	// BackoffMax (default 10 s) with Jitter (default 0.2); at most MaxAttempts (default 8) tries,
	// never past the context's deadline.
	BackoffInitial time.Duration
	BackoffMax     time.Duration
	Jitter         float64
	MaxAttempts    int
	// PollInterval is how often power is polled while waiting for a power state (default 1 s).
	// PowerOffWait bounds the wait for Off between ForceOff and On when a cycle cannot use
	// PowerCycle (default 2 min); not reaching Off fails the action.
	PollInterval time.Duration
	PowerOffWait time.Duration
	// SettleTimeout bounds the wait, after on and off (and the On ending a cycle), for the system
	// to report the new power state, and the wait for a transition (PoweringOn, PoweringOff) to end
	// before acting (default 60 s, as the IPMI driver's). A state that does not settle is logged,
	// not an error: the caller's next read reports what the BMC says.
	SettleTimeout time.Duration
	// RequestTimeout bounds one HTTP request (default 30 s).
	RequestTimeout time.Duration
	Log            *slog.Logger
	// Sessions remembers the BMCs whose sessions cannot be logged out, for every client given the
	// same one (the site agent shares one among its drivers). Nil remembers nothing: each client
	// tries a session first.
	Sessions *SessionMemory
}

func (o Options) withDefaults() Options {
	if o.BackoffInitial <= 0 {
		o.BackoffInitial = 500 * time.Millisecond
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = 10 * time.Second
	}
	if o.Jitter == 0 {
		o.Jitter = 0.2
	}
	if o.Jitter < 0 {
		o.Jitter = 0
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 8
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.PowerOffWait <= 0 {
		o.PowerOffWait = 2 * time.Minute
	}
	if o.SettleTimeout <= 0 {
		o.SettleTimeout = 60 * time.Second
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	return o
}

// Client drives one Redfish BMC. It is safe for concurrent use.
type Client struct {
	ep   bmc.Endpoint // holds the password: never print it (String shows only user@address)
	base string       // scheme://host[:port]
	opts Options
	log  *slog.Logger
	http *http.Client

	// named is the ComputerSystem the address names (/redfish/v1/Systems/ID), "" for none.
	named string

	mu     sync.Mutex
	api    *gofish.APIClient
	system string // the ComputerSystem's URI
}

var (
	_ bmc.Power             = (*Client)(nil)
	_ bmc.BootDeviceSetter  = (*Client)(nil)
	_ bmc.Inspector         = (*Client)(nil)
	_ bmc.VirtualMedia      = (*Client)(nil)
	_ bmc.CredentialRotator = (*Client)(nil)
)

// BaseURL turns an endpoint address (host, host:port or URL) into the service's base URL;
// HTTPS unless the address says http://. An address with user information ('@' anywhere: a
// password may hold '/') is refused; its query and fragment are not part of the base URL. Errors
// show the address as bmc.ShownAddress does, never a credential it may hold.
func BaseURL(address string) (string, error) {
	a := strings.TrimSpace(address)
	if a == "" {
		return "", errors.New("empty BMC address")
	}
	if !strings.Contains(a, "://") {
		a = "https://" + a
	}
	if strings.Contains(a, "@") { // never echo it: it holds a password
		return "", errors.New("BMC address holds credentials ('@'): give them as username and password")
	}
	scheme, rest, _ := strings.Cut(a, "://")
	if scheme != "http" && scheme != "https" {
		return "", fmt.Errorf("BMC address %q: the scheme is not http or https", bmc.ShownAddress(a))
	}
	// The path is not the service's (the root is fixed; SystemPath reads it), nor are a query or
	// a fragment (SystemPath refuses them).
	host := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		host = rest[:i]
	}
	if host == "" {
		return "", fmt.Errorf("BMC address %q: no host", bmc.ShownAddress(a))
	}
	return scheme + "://" + host, nil
}

// tlsConfig builds the TLS policy of an endpoint at base (its base URL, which errors name: the
// address may hold what base leaves out): a fingerprint pin, a CA bundle, insecure when asked
// for, else the system roots.
func tlsConfig(ep bmc.Endpoint, base string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case ep.FingerprintSHA256 != "":
		want, err := hex.DecodeString(strings.ReplaceAll(strings.ToLower(ep.FingerprintSHA256), ":", ""))
		if err != nil || len(want) != sha256.Size {
			return nil, fmt.Errorf("TLS fingerprint of %s is not 64 hex digits", base)
		}
		cfg.InsecureSkipVerify = true //nolint:gosec // replaced by the pin check below
		cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("the BMC presented no certificate")
			}
			got := sha256.Sum256(raw[0])
			if !bytes.Equal(got[:], want) {
				return fmt.Errorf("BMC certificate fingerprint %s does not match the pinned %s",
					hex.EncodeToString(got[:]), hex.EncodeToString(want))
			}
			return nil
		}
	case len(ep.CAPEM) > 0:
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(ep.CAPEM) {
			return nil, fmt.Errorf("CA bundle of %s holds no PEM certificate", base)
		}
		cfg.RootCAs = pool
	case ep.Insecure:
		cfg.InsecureSkipVerify = true //nolint:gosec // the operator asked for it
	}
	return cfg, nil
}

// New connects to the BMC at ep: a session when the service offers one, else basic auth.
func New(ctx context.Context, ep bmc.Endpoint, opts Options) (*Client, error) {
	opts = opts.withDefaults()
	base, err := BaseURL(ep.Address)
	if err != nil {
		return nil, fmt.Errorf("connecting to Redfish BMC: %w", err)
	}
	named, err := SystemPath(ep.Address)
	if err != nil {
		return nil, fmt.Errorf("connecting to Redfish BMC %s: %w", base, err)
	}
	tc, err := tlsConfig(ep, base)
	if err != nil {
		return nil, fmt.Errorf("connecting to Redfish BMC %s: %w", base, err)
	}
	c := &Client{ep: ep, base: base, named: named, opts: opts, log: opts.Log.With("bmc", base),
		http: &http.Client{Timeout: opts.RequestTimeout, Transport: cappedTransport{&http.Transport{
			TLSClientConfig: tc, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute,
			TLSHandshakeTimeout: 10 * time.Second}}}}
	err = c.retry(ctx, "logging in", func(ctx context.Context) error {
		api, err := c.connect(ctx, ep.Password)
		if err == nil {
			c.mu.Lock()
			c.api = api
			c.mu.Unlock()
		}
		return err
	})
	if err != nil {
		c.http.CloseIdleConnections()
		return nil, err
	}
	return c, nil
}

// connect logs in with password: a session first, basic auth when sessions are refused for any
// reason but bad credentials, or when a session could not be logged out (see login).
func (c *Client) connect(ctx context.Context, password string) (*gofish.APIClient, error) {
	cfg := gofish.ClientConfig{Endpoint: c.base, Username: c.ep.Username, Password: password,
		HTTPClient: c.http, NoModifyTransport: true, ReuseConnections: true, BasicAuth: c.opts.BasicAuth}
	if c.opts.BasicAuth {
		return gofish.ConnectContext(ctx, cfg)
	}
	if c.opts.Sessions.undeletable(c.base) {
		return c.connectBasic(ctx, cfg)
	}
	sess, err := c.login(ctx, password)
	switch {
	case err == nil:
		cfg.Session = sess
		api, err := gofish.ConnectContext(ctx, cfg)
		if err != nil {
			c.logoutRaw(ctx, sess)
			return nil, err
		}
		return api, nil
	case errors.Is(err, errSessionUndeletable):
		c.opts.Sessions.rememberUndeletable(c.base)
		c.log.WarnContext(ctx, "redfish session has no URI to log out with (no Location header, no @odata.id); using basic auth for this BMC")
	case isStatus(err, http.StatusUnauthorized) || !isRedfishError(err):
		return nil, err
	default:
		c.log.DebugContext(ctx, "redfish session refused, using basic auth", "reason", newRedactor(hideSecret(password)).message(err))
	}
	return c.connectBasic(ctx, cfg)
}

// connectBasic connects with basic auth and checks the credentials on a protected resource (basic
// auth is only checked there).
func (c *Client) connectBasic(ctx context.Context, cfg gofish.ClientConfig) (*gofish.APIClient, error) {
	cfg.BasicAuth = true
	cfg.Session = nil
	api, err := gofish.ConnectContext(ctx, cfg)
	if err != nil {
		return nil, err
	}
	resp, err := api.WithContext(ctx).Get("/redfish/v1/Systems")
	if resp != nil {
		_ = resp.Body.Close()
	}
	return api, err
}

// SessionMemory remembers, per base URL, the BMCs whose sessions cannot be logged out: every later
// client there given the same memory uses basic auth rather than leaking one session per
// operation. The zero value is ready; a nil one remembers nothing.
type SessionMemory struct{ undeletableAt sync.Map }

func (m *SessionMemory) undeletable(base string) bool {
	if m == nil {
		return false
	}
	_, ok := m.undeletableAt.Load(base)
	return ok
}

func (m *SessionMemory) rememberUndeletable(base string) {
	if m != nil {
		m.undeletableAt.Store(base, struct{}{})
	}
}

// errSessionUndeletable: the BMC created a session but named no URI to delete it with.
var errSessionUndeletable = errors.New("the BMC created a session without naming its URI")

// login creates a session itself rather than through gofish, which takes the session's URI only
// from the Location header: BMCs that send none (Huawei iBMC, some storage controllers) name it in
// the body's @odata.id, and without either the session could never be logged out.
func (c *Client) login(ctx context.Context, password string) (*gofish.Session, error) {
	var root struct {
		Links struct {
			Sessions odataRef `json:"Sessions"`
		} `json:"Links"`
	}
	if _, _, err := c.rawJSON(ctx, http.MethodGet, "/redfish/v1/", nil, &root); err != nil {
		return nil, fmt.Errorf("reading the service root: %w", err)
	}
	uri := root.Links.Sessions.ID
	if uri == "" {
		return nil, schemas.ConstructError(0, []byte("the service root links no Sessions collection"))
	}
	var created struct {
		ID string `json:"@odata.id"`
	}
	hdr, _, err := c.rawJSON(ctx, http.MethodPost, uri, map[string]string{"UserName": c.ep.Username, "Password": password}, &created)
	if err != nil {
		return nil, err
	}
	sess := &gofish.Session{Token: hdr.Get("X-Auth-Token"), ID: requestURI(hdr.Get("Location"))}
	if sess.ID == "" {
		sess.ID = requestURI(created.ID)
	}
	switch {
	case sess.ID == "":
		return nil, errSessionUndeletable
	case sess.Token == "":
		return nil, schemas.ConstructError(0, []byte("the BMC created a session without an X-Auth-Token"))
	}
	return sess, nil
}

// requestURI turns a session URI (absolute or a path) into the path gofish deletes.
func requestURI(s string) string {
	if s == "" {
		return ""
	}
	if u, err := url.Parse(s); err == nil && u.IsAbs() {
		return u.RequestURI()
	}
	return s
}

// logoutTimeout bounds the logout of a session gofish does not hold.
const logoutTimeout = 10 * time.Second

// logoutRaw deletes a session that gofish does not hold (best effort), even when ctx has ended
// (what made the connection fail, often): a session left behind holds one of the BMC's few
// session slots until it times out.
func (c *Client) logoutRaw(ctx context.Context, sess *gofish.Session) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), logoutTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, c.base+sess.ID, nil)
	if err != nil {
		return
	}
	req.Header.Set("X-Auth-Token", sess.Token)
	if resp, err := c.http.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
}

// rawJSON sends one request outside gofish (used before a session exists) and decodes a JSON
// answer into out when there is one. A non-2xx answer is a *schemas.Error, as gofish returns.
func (c *Client) rawJSON(ctx context.Context, method, path string, body, out any) (http.Header, int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("OData-Version", "4.0")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, resp.StatusCode, fmt.Errorf("reading the answer to %s %s: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.Header, resp.StatusCode, schemas.ConstructError(resp.StatusCode, b)
	}
	if len(bytes.TrimSpace(b)) > 0 && out != nil {
		_ = json.Unmarshal(b, out) // a session answer's body is informative only
	}
	return resp.Header, resp.StatusCode, nil
}

func isRedfishError(err error) bool {
	var re *schemas.Error
	return errors.As(err, &re)
}

func isStatus(err error, code int) bool {
	var re *schemas.Error
	return errors.As(err, &re) && re.HTTPReturnedStatusCode == code
}

// String names the BMC without its password.
func (c *Client) String() string { return "redfish " + c.ep.Username + "@" + c.base }

// GoString keeps %#v from printing the password.
func (c *Client) GoString() string { return c.String() }

// Close logs out.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	api := c.api
	c.api = nil
	c.mu.Unlock()
	if api != nil {
		api.WithContext(ctx).Logout()
	}
	c.http.CloseIdleConnections()
	return nil
}

func (c *Client) apiCtx(ctx context.Context) (*gofish.APIClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.api == nil {
		return nil, errors.New("client is closed")
	}
	return c.api.WithContext(ctx), nil
}

// retry runs op until it succeeds, fails for good, or runs out of attempts or time. The error
// names what was attempted against which BMC and carries the BMC's own message, with the
// password and each of hide (what op sends that the BMC may echo back: an image URL, a new
// password) hidden, as in the log lines of the retries.
func (c *Client) retry(ctx context.Context, what string, op func(ctx context.Context) error, hide ...hidden) error {
	red := c.redactor(hide...)
	var err error
	for attempt := 1; ; attempt++ {
		err = op(ctx)
		if err == nil {
			return nil
		}
		if !Transient(err) || attempt >= c.opts.MaxAttempts {
			break
		}
		wait := Backoff(attempt, c.opts.BackoffInitial, c.opts.BackoffMax, c.opts.Jitter)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			break
		}
		c.log.InfoContext(ctx, "redfish busy, retrying", "op", what, "attempt", attempt, "wait", wait, "reason", red.message(err))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s on Redfish BMC %s: %s (gave up: %w)", what, c.base, red.message(err), ctx.Err())
		case <-t.C:
		}
	}
	return &Error{Op: what, BMC: c.base, Message: red.message(err), err: red.cause(err)}
}

// redactor hides the password the client logs in with and each of hide.
func (c *Client) redactor(hide ...hidden) redactor {
	c.mu.Lock()
	password := c.ep.Password
	c.mu.Unlock()
	return newRedactor(append([]hidden{hideSecret(password)}, hide...)...)
}

// Error is a failed BMC operation. Neither its text nor what it wraps holds a credential the
// driver sent (see Client.retry).
type Error struct {
	Op      string // what was attempted
	BMC     string // base URL
	Message string // the BMC's own message, redacted
	err     error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s on Redfish BMC %s: %s", e.Op, e.BMC, e.Message)
}
func (e *Error) Unwrap() error { return e.err }

// maxAnswer bounds the body of any answer the driver reads from a BMC (gofish reads error
// bodies and the service root whole): a BMC, faulty or hostile, cannot make the site agent hold
// more than this per request.
const maxAnswer = 4 << 20

// errAnswerTooLarge ends the read of a body longer than maxAnswer.
var errAnswerTooLarge = fmt.Errorf("the BMC's answer is larger than %d bytes", maxAnswer)

// cappedTransport cuts every response body at maxAnswer bytes (a longer one reads as an error).
type cappedTransport struct{ rt *http.Transport }

func (t cappedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(r)
	if resp != nil && resp.Body != nil {
		resp.Body = &cappedBody{rc: resp.Body, left: maxAnswer}
	}
	return resp, err
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the transport.
func (t cappedTransport) CloseIdleConnections() { t.rt.CloseIdleConnections() }

type cappedBody struct {
	rc   io.ReadCloser
	left int64
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		n, err := b.rc.Read(one[:])
		if n > 0 {
			return 0, errAnswerTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	return n, err
}

func (b *cappedBody) Close() error { return b.rc.Close() }

// getJSON reads uri into out and returns its ETag (header first, then @odata.etag).
func (c *Client) getJSON(ctx context.Context, uri string, out any) (string, error) {
	api, err := c.apiCtx(ctx)
	if err != nil {
		return "", err
	}
	resp, err := api.Get(uri)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("reading %s: %w", uri, err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return "", fmt.Errorf("decoding %s: %w", uri, err)
	}
	tag := resp.Header.Get("ETag")
	if tag == "" {
		var e struct {
			ETag string `json:"@odata.etag"`
		}
		_ = json.Unmarshal(b, &e)
		tag = e.ETag
	}
	return tag, nil
}

func (c *Client) send(ctx context.Context, method, uri string, body any, etag string) error {
	api, err := c.apiCtx(ctx)
	if err != nil {
		return err
	}
	hdr := map[string]string{}
	if etag != "" {
		hdr["If-Match"] = etag
	}
	var resp *http.Response
	switch method {
	case http.MethodPatch:
		resp, err = api.PatchWithHeaders(uri, body, hdr)
	case http.MethodPost:
		resp, err = api.PostWithHeaders(uri, body, hdr)
	default:
		return fmt.Errorf("unsupported method %s", method)
	}
	if resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	return err
}
