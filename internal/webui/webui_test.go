package webui_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"bcd/internal/auth"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/server"
	"bcd/internal/store"
)

// bmcPassword is every test node's BMC password: no page may show it.
const bmcPassword = "ui-test-bmc-password-7f3a9c"

// env is a real bcd server on loopback (SQLite in a temp dir) and what the tests made in it.
type env struct {
	srv   *server.Server
	svc   *metal.Service
	ctx   context.Context
	admin auth.Principal // for setting up through the service
	// seen holds every response body the tests read, checked at the end for secrets.
	mu      sync.Mutex
	seen    []string
	secrets []string
	// transport is the client's (nil: the default; over TLS, one trusting the server).
	transport http.RoundTripper
}

func newEnv(t *testing.T) *env { return newEnvWith(t, server.Config{}) }

// newEnvWith starts the server with cfg, its addresses and data dir filled in.
func newEnvWith(t *testing.T, cfg server.Config) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Listen, cfg.DataDir = "127.0.0.1:0", t.TempDir()
	if cfg.GatewayListen == "" {
		cfg.GatewayListen = "off"
	}
	srv, err := server.New(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	e := &env{srv: srv, svc: srv.Service(), ctx: ctx, admin: auth.Principal{Name: "setup", Role: auth.Admin}, secrets: []string{bmcPassword, srv.FirstAdminToken()}}
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("server: %v", err)
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, body := range e.seen {
			for i, s := range e.secrets {
				if strings.Contains(body, s) {
					t.Errorf("a response body holds secret #%d (0: the BMC password, 1: the admin token, then the tokens made): %.300s", i, strings.ReplaceAll(body, s, "<secret>"))
				}
			}
		}
	})
	return e
}

// token creates a token and registers its secret as one no page may show.
func (e *env) token(t *testing.T, name string, role auth.Role, tenant string) string {
	t.Helper()
	secret, _, err := e.svc.CreateToken(e.ctx, e.admin, name, role, tenant)
	if err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.secrets = append(e.secrets, secret)
	e.mu.Unlock()
	return secret
}

func (e *env) enroll(t *testing.T, name, pool string, i int) store.Node {
	t.Helper()
	n, err := e.svc.Enroll(e.ctx, e.admin, metal.EnrollInput{Name: name, Pool: pool, MACs: []string{fmt.Sprintf("02:ee:00:00:%02x:%02x", i/256, i%256)},
		BMC: metal.BMCInput{Address: fmt.Sprintf("https://10.99.%d.%d", i/256, i%256), Username: "root", Password: bmcPassword}})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// resp is a response read whole.
type resp struct {
	code   int
	header http.Header
	body   string
	cookie *http.Cookie // the session cookie it set, if any
}

// do sends a request to the UI without following redirects; cookie is the session's token ("":
// none), headers extra headers.
func (e *env) do(t *testing.T, method, path, cookie string, form url.Values, headers ...string) resp {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(e.ctx, method, e.srv.URL()+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if cookie != "" {
		req.AddCookie(&http.Cookie{Name: "bcd_ui_session", Value: cookie})
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }, Transport: e.transport}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := resp{code: res.StatusCode, header: res.Header, body: string(b)}
	for _, c := range res.Cookies() {
		if c.Name == "bcd_ui_session" {
			r.cookie = c
		}
	}
	e.mu.Lock()
	h := res.Header.Clone()
	h.Del("Set-Cookie") // the session cookie holds the token by design
	e.seen = append(e.seen, r.body, fmt.Sprint(h))
	e.mu.Unlock()
	checkHeaders(t, method+" "+path, r)
	return r
}

// checkHeaders: every UI response carries the security headers.
func checkHeaders(t *testing.T, what string, r resp) {
	t.Helper()
	for h, want := range map[string]string{
		"Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
		"X-Content-Type-Options":  "nosniff",
		"Referrer-Policy":         "no-referrer",
	} {
		if got := r.header.Get(h); !strings.HasPrefix(got, want) {
			t.Errorf("%s: %s is %q, want %q", what, h, got, want)
		}
	}
	if csp := r.header.Get("Content-Security-Policy"); strings.Contains(csp, "unsafe") {
		t.Errorf("%s: CSP allows unsafe sources: %s", what, csp)
	}
	if ct := r.header.Get("Content-Type"); strings.HasPrefix(ct, "text/html") && r.header.Get("Cache-Control") != "no-store" {
		t.Errorf("%s: a page with Cache-Control %q, want no-store", what, r.header.Get("Cache-Control"))
	}
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the CSRF token of the forms of a page.
func csrf(t *testing.T, page resp) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(page.body)
	if m == nil {
		t.Fatalf("no CSRF token in the page: %.500s", page.body)
	}
	return m[1]
}

// login logs in with tok and returns the session cookie's value.
func (e *env) login(t *testing.T, tok string) string {
	t.Helper()
	r := e.do(t, "POST", "/ui/login", "", url.Values{"token": {tok}})
	if r.code != http.StatusSeeOther || r.header.Get("Location") != "/ui/" || r.cookie == nil {
		t.Fatalf("login: %d %v %.300s", r.code, r.header, r.body)
	}
	return r.cookie.Value
}

func TestLogin(t *testing.T) {
	e := newEnv(t)
	viewer := e.token(t, "alice", auth.Viewer, "")
	revoked := e.token(t, "bob", auth.Viewer, "")
	if _, err := e.svc.RevokeToken(e.ctx, e.admin, "bob"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, token string
		code        int
		want        string
	}{
		{"good token", viewer, http.StatusSeeOther, ""},
		{"not a token", "hunter2", http.StatusUnauthorized, "Not a bcd API token"},
		{"unknown token", auth.TokenPrefix + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", http.StatusUnauthorized, "Unknown or revoked token"},
		{"revoked token", revoked, http.StatusUnauthorized, "Unknown or revoked token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(t, "POST", "/ui/login", "", url.Values{"token": {tc.token}})
			if r.code != tc.code || !strings.Contains(r.body, tc.want) {
				t.Fatalf("%d %.400s", r.code, r.body)
			}
			if tc.code != http.StatusSeeOther {
				if r.cookie != nil {
					t.Fatalf("a failed login set a cookie")
				}
				return
			}
			c := r.cookie
			if c == nil || c.Value != tc.token || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/ui/" || c.Secure {
				t.Fatalf("cookie %+v: want the token, HttpOnly, SameSite=Strict, Path=/ui/, not Secure over plain HTTP", c)
			}
			if d := e.do(t, "GET", "/ui/", c.Value, nil); d.code != 200 || !strings.Contains(d.body, "Nodes per state") || !strings.Contains(d.body, "alice (viewer") {
				t.Fatalf("dashboard after login: %d %.400s", d.code, d.body)
			}
		})
	}
	t.Run("no session", func(t *testing.T) {
		r := e.do(t, "GET", "/ui/nodes", "", nil)
		if r.code != http.StatusSeeOther || r.header.Get("Location") != "/ui/login" {
			t.Fatalf("%d %v", r.code, r.header)
		}
		if r := e.do(t, "GET", "/ui", "", nil); r.code != http.StatusMovedPermanently || r.header.Get("Location") != "/ui/" {
			t.Fatalf("/ui: %d %v", r.code, r.header)
		}
	})
	t.Run("revoked while logged in", func(t *testing.T) {
		tok := e.token(t, "carol", auth.Viewer, "")
		cookie := e.login(t, tok)
		if _, err := e.svc.RevokeToken(e.ctx, e.admin, "carol"); err != nil {
			t.Fatal(err)
		}
		r := e.do(t, "GET", "/ui/nodes", cookie, nil)
		if r.code != http.StatusSeeOther || r.header.Get("Location") != "/ui/login?m=revoked" || r.cookie == nil || r.cookie.MaxAge >= 0 {
			t.Fatalf("revoked session: %d %v cookie %+v", r.code, r.header, r.cookie)
		}
		if p := e.do(t, "GET", r.header.Get("Location"), "", nil); !strings.Contains(p.body, "its token was revoked") {
			t.Fatalf("login page: %.400s", p.body)
		}
		// A live refresh is told to load the login page, not to swap it into its table.
		h := e.do(t, "GET", "/ui/events/rows", cookie, nil, "HX-Request", "true")
		if h.code != http.StatusUnauthorized || h.header.Get("HX-Redirect") != "/ui/login?m=revoked" {
			t.Fatalf("htmx request of a revoked session: %d %v", h.code, h.header)
		}
	})
	t.Run("logout", func(t *testing.T) {
		tok := e.token(t, "dave", auth.Viewer, "")
		cookie := e.login(t, tok)
		page := e.do(t, "GET", "/ui/", cookie, nil)
		if r := e.do(t, "POST", "/ui/logout", cookie, url.Values{}); r.code != http.StatusForbidden {
			t.Fatalf("logout without its CSRF token: %d", r.code)
		}
		r := e.do(t, "POST", "/ui/logout", cookie, url.Values{"csrf": {csrf(t, page)}})
		if r.code != http.StatusSeeOther || r.cookie == nil || r.cookie.Value != "" || r.cookie.MaxAge >= 0 {
			t.Fatalf("logout: %d cookie %+v", r.code, r.cookie)
		}
	})
}

func TestNodeListFiltersAndPages(t *testing.T) {
	e := newEnv(t)
	if _, err := e.svc.CreatePool(e.ctx, e.admin, "gpu", "default", store.PoolPolicy{HardwareProfile: "redfish"}); err != nil {
		t.Fatal(err)
	}
	var all, gpu []string
	for i := range 8 {
		pool := "default"
		if i%3 == 0 {
			pool = "gpu"
		}
		n := e.enroll(t, fmt.Sprintf("node-%02d", i), pool, i)
		all = append(all, n.Name)
		if pool == "gpu" {
			gpu = append(gpu, n.Name)
		}
	}
	for _, name := range []string{"node-01", "node-02"} {
		if _, _, err := e.svc.Apply(e.ctx, e.admin, provision.VerbMaintenance, metal.VerbInput{Node: name, MaintenanceOn: true, Reason: "test"}); err != nil {
			t.Fatal(err)
		}
	}
	// Inventories: node-00 without a GPU, node-03 with two and 64 GiB, node-06 with one and 8 GiB.
	for name, inv := range map[string]string{
		"node-00": `{"memory":{"totalBytes":68719476736}}`,
		"node-03": `{"memory":{"totalBytes":68719476736},"pci":[{"gpu":true},{"gpu":true}]}`,
		"node-06": `{"memory":{"totalBytes":8589934592},"pci":[{"gpu":true}]}`,
	} {
		if err := e.svc.Store().Write(e.ctx, func(tx *store.Tx) error {
			n, err := tx.LockNode(e.ctx, name, "")
			if err != nil {
				return err
			}
			return tx.PutInventory(e.ctx, n.ID, json.RawMessage(inv))
		}); err != nil {
			t.Fatal(err)
		}
	}
	cookie := e.login(t, e.token(t, "viewer", auth.Viewer, ""))
	names := regexp.MustCompile(`>(node-\d\d)</a>`)
	list := func(t *testing.T, query string) ([]string, resp) {
		t.Helper()
		r := e.do(t, "GET", "/ui/nodes?"+query, cookie, nil)
		var out []string
		for _, m := range names.FindAllStringSubmatch(r.body, -1) {
			out = append(out, m[1])
		}
		return out, r
	}
	for _, tc := range []struct {
		name, query string
		code        int
		want        []string // nil with a code other than 200
		msg         string
	}{
		{"every node", "", 200, all, ""},
		{"pool", "pool=gpu", 200, gpu, ""},
		{"site", "site=default", 200, all, ""},
		{"state", "state=enrolling", 200, all, ""},
		{"state none", "state=ready", 200, nil, "No node matches"},
		{"maintenance", "maintenance=true", 200, []string{"node-01", "node-02"}, ""},
		{"maintenance and pool", "maintenance=false&pool=gpu", 200, gpu, ""},
		{"unknown state", "state=sleeping", 400, nil, "unknown state &#34;sleeping&#34;: accepted are"},
		{"unknown pool", "pool=nope", 400, nil, `no pool named &#34;nope&#34;`},
		{"bad maintenance", "maintenance=maybe", 400, nil, "accepted are true, false or empty"},
		{"bad page size", "page_size=lots", 400, nil, "page_size &#34;lots&#34;: accepted are whole numbers from 1 to 1000"},
		{"page size too large", "page_size=5000", 400, nil, "accepted are whole numbers from 1 to 1000"},
		{"bad page token", "page=%21%21", 400, nil, "page_token"},
		{"hardware", "require=gpus%3E%3D1", 200, []string{"node-03", "node-06"}, `value="gpus&gt;=1"`},
		{"hardware, two requirements", "require=gpus%3E%3D1%2C+memory%3E%3D16GiB%2C", 200, []string{"node-03"}, `value="gpus&gt;=1, memory&gt;=16GiB"`},
		{"bad requirement", "require=ram%3E1", 400, nil, "unknown key &#34;ram&#34;"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, r := list(t, tc.query)
			if r.code != tc.code || !strings.Contains(r.body, tc.msg) || strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("%d %v, want %d %v with %q: %.600s", r.code, got, tc.code, tc.want, tc.msg, r.body)
			}
		})
	}
	t.Run("pages", func(t *testing.T) {
		var seen []string
		next := "/ui/nodes?page_size=3"
		for pages := 0; next != ""; pages++ {
			if pages > 3 {
				t.Fatal("more pages than 8 nodes in pages of 3 make")
			}
			r := e.do(t, "GET", next, cookie, nil)
			got := names.FindAllStringSubmatch(r.body, -1)
			if want := min(3, len(all)-len(seen)); len(got) != want {
				t.Fatalf("page %d: %d nodes, want %d", pages, len(got), want)
			}
			for _, m := range got {
				seen = append(seen, m[1])
			}
			next = ""
			if m := regexp.MustCompile(`href="([^"]+)">Next page`).FindStringSubmatch(r.body); m != nil {
				next = strings.ReplaceAll(m[1], "&amp;", "&")
			}
		}
		if strings.Join(seen, ",") != strings.Join(all, ",") {
			t.Fatalf("pages gave %v, want %v", seen, all)
		}
	})
}

// TestTenantIsolation: a tenant's token never sees another tenant's node, by name or id, in
// the list, the node page, the events or the dashboard.
func TestTenantIsolation(t *testing.T) {
	e := newEnv(t)
	for _, tn := range []string{"acme", "globex"} {
		if _, err := e.svc.CreateTenant(e.ctx, e.admin, tn); err != nil {
			t.Fatal(err)
		}
		if _, err := e.svc.CreateSite(e.ctx, e.admin, tn+"-site", tn, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := e.svc.CreatePool(e.ctx, e.admin, tn+"-pool", tn+"-site", store.PoolPolicy{HardwareProfile: "redfish"}); err != nil {
			t.Fatal(err)
		}
	}
	mine := e.enroll(t, "acme-box", "acme-pool", 1)
	theirs := e.enroll(t, "globex-secret-box", "globex-pool", 2)
	cookie := e.login(t, e.token(t, "acme-ops", auth.Operator, "acme"))
	for _, path := range []string{"/ui/", "/ui/nodes", "/ui/nodes?page_size=1000", "/ui/events", "/ui/events/rows", "/ui/events?node=" + theirs.ID,
		"/ui/nodes/" + theirs.ID, "/ui/nodes/" + theirs.Name, "/ui/batches", "/ui/nodes/" + mine.ID} {
		r := e.do(t, "GET", path, cookie, nil)
		for _, leak := range []string{theirs.ID, theirs.Name, "globex"} {
			// A page asked for their node by id or name may repeat what was asked (not found).
			if strings.Contains(path, leak) {
				continue
			}
			if strings.Contains(r.body, leak) {
				t.Errorf("%s (%d) shows %q of another tenant: %.600s", path, r.code, leak, r.body)
			}
		}
		switch {
		case strings.HasPrefix(path, "/ui/nodes/") && path != "/ui/nodes/"+mine.ID:
			if r.code != http.StatusNotFound || !strings.Contains(r.body, "not_found") {
				t.Errorf("%s: %d, want 404 not_found", path, r.code)
			}
		case strings.Contains(path, "node="):
			if r.code != 200 || !strings.Contains(r.body, "No events.") {
				t.Errorf("%s: %d, want no events: %.600s", path, r.code, r.body)
			}
		}
	}
	if r := e.do(t, "GET", "/ui/nodes", cookie, nil); !strings.Contains(r.body, "acme-box") {
		t.Fatalf("the tenant's own node is not listed: %.600s", r.body)
	}
	if r := e.do(t, "GET", "/ui/events", cookie, nil); !strings.Contains(r.body, mine.ID) || !strings.Contains(r.body, ">acme-box<") {
		t.Fatalf("the tenant's own node's events are not listed: %.600s", r.body)
	}
	// The admin (every tenant) sees both.
	admin := e.login(t, e.srv.FirstAdminToken())
	if r := e.do(t, "GET", "/ui/nodes", admin, nil); !strings.Contains(r.body, "acme-box") || !strings.Contains(r.body, "globex-secret-box") {
		t.Fatalf("admin's list: %.600s", r.body)
	}
	// Each enrolment's first command waits for a site agent (none is connected): the tenant's
	// dashboard counts its own site's, the admin's both.
	waiting := regexp.MustCompile(`Commands waiting for the site agents: <strong>(\d+)</strong>`)
	deadline := time.Now().Add(30 * time.Second)
	for {
		mineN := waiting.FindStringSubmatch(e.do(t, "GET", "/ui/", cookie, nil).body)
		allN := waiting.FindStringSubmatch(e.do(t, "GET", "/ui/", admin, nil).body)
		if mineN != nil && allN != nil && mineN[1] == "1" && allN[1] == "2" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("commands waiting for the site agents: the tenant's dashboard %v, the admin's %v: want 1 and 2", mineN, allN)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pendingBatch makes a batch that waits for one approval: a failed node retired in a pool
// whose policy requires an approval. The requester is e.admin ("token:setup").
func (e *env) pendingBatch(t *testing.T, name string, i int) store.Batch {
	t.Helper()
	n := e.enroll(t, name, "default", i)
	if _, _, err := e.svc.Apply(e.ctx, e.admin, provision.VerbAbort, metal.VerbInput{Node: n.Name, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.svc.Apply(e.ctx, e.admin, provision.VerbMaintenance, metal.VerbInput{Node: n.Name, MaintenanceOn: false, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.SetApprovalPolicy(e.ctx, e.admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	res, err := e.svc.Bulk(e.ctx, e.admin, metal.BulkInput{Pool: "default", Verb: "retire", Nodes: []string{n.Name}, Reason: "end of life"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Held || len(res.Nodes) != 1 || !res.Nodes[0].Accepted {
		t.Fatalf("bulk: %+v", res)
	}
	b, _, err := e.svc.Batch(e.ctx, e.admin, res.Batch.ID, 0)
	if err != nil || b.State != store.BatchPending {
		t.Fatalf("batch %+v %v, want pending", b, err)
	}
	return b
}

func (e *env) batchState(t *testing.T, id string) string {
	t.Helper()
	b, _, err := e.svc.Batch(e.ctx, e.admin, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	return b.State
}

// TestApproveThroughTheUI: approval goes through the service's checks (a viewer is refused as
// the API refuses it) and CSRF; an approver's approval moves the batch as the API's would.
func TestApproveThroughTheUI(t *testing.T) {
	e := newEnv(t)
	b := e.pendingBatch(t, "doomed", 9)
	viewer := e.login(t, e.token(t, "watcher", auth.Viewer, ""))
	approver := e.login(t, e.token(t, "alice", auth.Approver, ""))
	path := "/ui/batches/" + b.ID
	page := e.do(t, "GET", path, approver, nil)
	if page.code != 200 || !strings.Contains(page.body, "Approve") || !strings.Contains(page.body, "end of life") {
		t.Fatalf("batch page: %d %.600s", page.code, page.body)
	}
	token := csrf(t, page)
	viewerToken := csrf(t, e.do(t, "GET", path, viewer, nil))
	for _, tc := range []struct {
		name    string
		cookie  string
		form    url.Values
		headers []string
		code    int
		msg     string
	}{
		{"viewer", viewer, url.Values{"csrf": {viewerToken}}, nil, 403, `permission_denied: token &#34;watcher&#34; has role viewer, which does not allow approve`},
		{"no CSRF token", approver, url.Values{"reason": {"ok"}}, nil, 403, "the form carried no CSRF token"},
		{"wrong CSRF token", approver, url.Values{"csrf": {"x" + token}}, nil, 403, "does not belong to this session"},
		{"another session's CSRF token", approver, url.Values{"csrf": {viewerToken}}, nil, 403, "does not belong to this session"},
		{"another site", approver, url.Values{"csrf": {token}}, []string{"Sec-Fetch-Site", "cross-site"}, 403, "posted from another site"},
		{"another origin", approver, url.Values{"csrf": {token}}, []string{"Origin", "https://evil.example"}, 403, "from another origin"},
		{"unknown action", approver, url.Values{"csrf": {token}}, nil, 404, "accepted are approve, reject, withdraw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			action := "/approve"
			if tc.name == "unknown action" {
				action = "/bless"
			}
			r := e.do(t, "POST", path+action, tc.cookie, tc.form, tc.headers...)
			if r.code != tc.code || !strings.Contains(r.body, tc.msg) {
				t.Fatalf("%d %.600s, want %d with %q", r.code, r.body, tc.code, tc.msg)
			}
			if s := e.batchState(t, b.ID); s != store.BatchPending {
				t.Fatalf("the batch is %s after a refused approval", s)
			}
		})
	}
	r := e.do(t, "POST", path+"/approve", approver, url.Values{"csrf": {token}, "reason": {"looked at it"}}, "Origin", e.srv.URL(), "Sec-Fetch-Site", "same-origin")
	if r.code != http.StatusSeeOther || r.header.Get("Location") != path+"?done=approved" {
		t.Fatalf("approve: %d %v %.400s", r.code, r.header, r.body)
	}
	// (The engine may start the approved batch before it is read: running follows approved.)
	if s := e.batchState(t, b.ID); s != store.BatchApproved && s != store.BatchRunning {
		t.Fatalf("batch %s after the approval, want approved (or running)", s)
	}
	if p := e.do(t, "GET", r.header.Get("Location"), approver, nil); !strings.Contains(p.body, "Your approval was recorded") || !strings.Contains(p.body, "token:alice") {
		t.Fatalf("batch page after approval: %.600s", p.body)
	}
	// Reject ends another batch, as the API's Reject does; withdrawing once it is decided is
	// refused with the service's words.
	b2 := e.pendingBatch(t, "doomed-too", 10)
	path2 := "/ui/batches/" + b2.ID
	if r := e.do(t, "POST", path2+"/reject", approver, url.Values{"csrf": {token}, "reason": {"no"}}); r.code != http.StatusSeeOther {
		t.Fatalf("reject: %d %.400s", r.code, r.body)
	}
	if s := e.batchState(t, b2.ID); s != store.BatchRejected {
		t.Fatalf("batch %s after rejecting, want rejected", s)
	}
	if r := e.do(t, "POST", path2+"/withdraw", approver, url.Values{"csrf": {token}}); r.code != http.StatusConflict || !strings.Contains(r.body, "failed_precondition: ") {
		t.Fatalf("withdraw from a rejected batch: %d %.1500s", r.code, r.body)
	}
	// Its node's workflow, aborted by the rejection, is listed on the batch's page.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		p := e.do(t, "GET", path2, approver, nil)
		if strings.Contains(p.body, "0 failed, 1 aborted") && strings.Contains(p.body, "<h2>Failed or aborted</h2>") && strings.Contains(p.body, ">doomed-too</a></td><td>aborted</td><td>BATCH_REJECTED</td>") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the rejected batch's page without its aborted node: %.4000s", p.body)
		}
	}
}

// TestPagesShowNoSecret visits every page as an admin with a node that has BMC credentials
// and a pending batch: the BMC password and the tokens appear in none (env's cleanup checks
// every body read), and every response has the security headers (env.do checks them).
func TestPagesShowNoSecret(t *testing.T) {
	e := newEnv(t)
	n := e.enroll(t, "bmc-box", "default", 3)
	b := e.pendingBatch(t, "doomed", 9)
	cookie := e.login(t, e.srv.FirstAdminToken())
	for _, path := range []string{"/ui/login", "/ui/login?m=revoked", "/ui/", "/ui/nodes", "/ui/nodes/" + n.ID, "/ui/nodes/" + n.Name, "/ui/batches",
		"/ui/batches?state=pending", "/ui/batches/" + b.ID, "/ui/events", "/ui/events/rows?limit=5", "/ui/events?node=" + n.Name, "/ui/nope",
		"/ui/static/ui.css", "/ui/static/htmx.min.js", "/ui/static/", "/ui/events?limit=0", "/ui/batches?state=odd",
		"/ui/nodes/" + n.ID + "?done=abort", "/ui/nodes/" + n.ID + "?done=maintenance-on", "/ui/nodes/" + n.ID + "?done=power-held&batch=" + b.ID,
		"/ui/nodes/doomed", "/ui/nodes/doomed?done=retire"} {
		r := e.do(t, "GET", path, cookie, nil)
		if r.code >= 500 {
			t.Errorf("%s: %d %.300s", path, r.code, r.body)
		}
	}
	p := e.do(t, "GET", "/ui/nodes/"+n.ID, cookie, nil)
	if !strings.Contains(p.body, "https://10.99.0.3") || !strings.Contains(p.body, "metal-enroll") {
		t.Fatalf("node page lacks its BMC address or workflow: %.2000s", p.body)
	}
	// Its workflow's commands: one its first step sent, taken by a site agent.
	wfs, err := e.svc.Store().Workflows(e.ctx, n.ID, 1)
	if err != nil || len(wfs) != 1 {
		t.Fatalf("the node's workflow: %v, %v", wfs, err)
	}
	if err := e.svc.Store().Write(e.ctx, func(tx *store.Tx) error {
		c := store.Command{NodeID: n.ID, TenantID: n.TenantID, SiteID: n.SiteID, Kind: "bmc.query", Subject: n.ID, WorkflowID: wfs[0].ID,
			TargetAgent: "site-a", State: "delivered", RunsOn: "site", Args: "{}"}
		if err := tx.InsertCommand(e.ctx, &c); err != nil {
			return err
		}
		c.DeliveredAt = c.CreatedAt + 2500
		return tx.UpdateCommand(e.ctx, &c)
	}); err != nil {
		t.Fatal(err)
	}
	if p := e.do(t, "GET", "/ui/nodes/"+n.ID, cookie, nil); !strings.Contains(p.body, "<h3>Commands</h3>") ||
		!strings.Contains(p.body, "<td><code>bmc.query</code></td><td>site-a</td><td>delivered</td><td>3ms</td><td></td>") {
		t.Fatalf("node page lacks its workflow's commands: %.6000s", p.body)
	}
	// Its hardware: none before an inspection, then as its ramdisk reported it.
	if !strings.Contains(p.body, "No inventory yet") {
		t.Fatalf("node page of a node never inspected: %.3000s", p.body)
	}
	if err := e.svc.Store().Write(e.ctx, func(tx *store.Tx) error {
		return tx.PutInventory(e.ctx, n.ID, json.RawMessage(`{"memory":{"totalBytes":549755813888},"dmi":{"sysVendor":"Dell Inc.","productName":"XE8640"},"bootMode":"uefi"}`))
	}); err != nil {
		t.Fatal(err)
	}
	if hw := e.do(t, "GET", "/ui/nodes/"+n.ID, cookie, nil); !strings.Contains(hw.body, "<tr><th>memory</th><td>512GiB</td></tr>") || !strings.Contains(hw.body, "Dell Inc. XE8640") ||
		strings.Contains(hw.body, "No inventory yet") {
		t.Fatalf("node page of an inspected node: %.5000s", hw.body)
	}
	// The node's verb forms (an admin may operate) and a refused verb's page.
	if !strings.Contains(p.body, `action="/ui/nodes/`+n.ID+`/verb/abort"`) || !strings.Contains(p.body, `name="confirm"`) {
		t.Fatalf("node page lacks its verb forms: %.3000s", p.body)
	}
	if r := e.do(t, "POST", "/ui/nodes/"+n.ID+"/verb/maintenance", cookie, url.Values{"csrf": {csrf(t, p)}, "version": {"999999"}, "on": {"true"}}); r.code != http.StatusConflict {
		t.Fatalf("stale maintenance: %d %.300s", r.code, r.body)
	}
	if r := e.do(t, "GET", "/ui/events?limit=0", cookie, nil); r.code != 400 || !strings.Contains(r.body, "accepted are whole numbers from 1 to 500") {
		t.Fatalf("bad limit: %d %.300s", r.code, r.body)
	}
	if r := e.do(t, "GET", "/ui/batches?state=odd", cookie, nil); r.code != 400 || !strings.Contains(r.body, "accepted are pending, approved") {
		t.Fatalf("bad batch state: %d %.300s", r.code, r.body)
	}
	if r := e.do(t, "GET", "/ui/static/htmx.min.js", cookie, nil); r.code != 200 || !strings.Contains(r.header.Get("Content-Type"), "javascript") {
		t.Fatalf("htmx: %d %v", r.code, r.header)
	}
	if r := e.do(t, "GET", "/ui/static/", cookie, nil); r.code != http.StatusNotFound {
		t.Fatalf("the static files' directory is listed: %d %.300s", r.code, r.body)
	}
	// Live refresh: the events table polls its own URL.
	if r := e.do(t, "GET", "/ui/events", cookie, nil); !strings.Contains(r.body, `hx-get="/ui/events/rows?limit=100"`) || !strings.Contains(r.body, `hx-trigger="every 2s"`) {
		t.Fatalf("events page without its refresh: %.1000s", r.body)
	}
	// Events by kind: the enrolment alone, its refresh keeping the filter; a kind that is not
	// one is refused saying what is.
	if r := e.do(t, "GET", "/ui/events?kind=node.enroll,+batch.*", cookie, nil); r.code != 200 || !strings.Contains(r.body, "<td>node.enroll</td>") ||
		strings.Contains(r.body, "<td>workflow.") || !strings.Contains(r.body, `hx-get="/ui/events/rows?kind=node.enroll%2Cbatch.%2A&amp;limit=100"`) ||
		!strings.Contains(r.body, `value="node.enroll, batch.*"`) {
		t.Fatalf("events of kind node.enroll and batch.*: %d %.3000s", r.code, r.body)
	}
	if r := e.do(t, "GET", "/ui/events?kind=Node.Enroll", cookie, nil); r.code != 400 || !strings.Contains(r.body, "is not an event kind") {
		t.Fatalf("a bad kind: %d %.1000s", r.code, r.body)
	}
	// Paging back: every event, two a page, read through the Older links from the live page,
	// is the log newest first, each once; the older pages do not refresh and link back to the
	// live one.
	all, err := e.svc.ListEvents(e.ctx, e.admin, metal.EventQuery{Limit: 500})
	if err != nil || len(all) < 5 {
		t.Fatalf("the event log: %d events, %v: want at least 5", len(all), err)
	}
	ids := regexp.MustCompile(`<td class="num">(\d+)</td>`)
	older := regexp.MustCompile(`href="([^"]+)">Older events`)
	var seen []string
	page, pages := "/ui/events?limit=2", 0
	for page != "" {
		if pages > len(all) {
			t.Fatalf("%d pages of two events for %d events: the Older links go round (%v)", pages, len(all), seen)
		}
		r := e.do(t, "GET", page, cookie, nil)
		if r.code != 200 {
			t.Fatalf("%s: %d %.1000s", page, r.code, r.body)
		}
		live := strings.Contains(r.body, "hx-get=")
		if live != (pages == 0) || pages > 0 && !strings.Contains(r.body, `href="/ui/events?limit=2">Newest events`) {
			t.Fatalf("page %d (%s): refreshes %v, want only the first to; older pages link to the newest: %.2000s", pages, page, live, r.body)
		}
		for _, m := range ids.FindAllStringSubmatch(r.body, -1) {
			seen = append(seen, m[1])
		}
		page = ""
		if m := older.FindStringSubmatch(r.body); m != nil {
			page = strings.ReplaceAll(m[1], "&amp;", "&")
		}
		pages++
	}
	want := make([]string, len(all))
	for i, ev := range all {
		want[len(all)-1-i] = strconv.FormatUint(ev.ID, 10)
	}
	if strings.Join(seen, ",") != strings.Join(want, ",") {
		t.Fatalf("paging back two at a time (%d pages) gave %v, want %v", pages, seen, want)
	}
	if r := e.do(t, "GET", "/ui/events?before=x", cookie, nil); r.code != 400 || !strings.Contains(r.body, "accepted is an event&#39;s number") {
		t.Fatalf("a bad before: %d %.600s", r.code, r.body)
	}
}

// TestScale: the UI pages through the store: the node list, a deep page, a filtered page,
// the dashboard (its counts per state and of the nodes in maintenance come from one query each,
// exact however many nodes there are: half of them are in maintenance, more than a page) and
// the events page. It seeds 3,000 nodes; BCD_WEBUI_SCALE_NODES=100000 measures the design's
// scale (docs/webui.md has the numbers). The bound asserted is loose; the times are logged.
func TestScale(t *testing.T) {
	total := 3000
	if s := os.Getenv("BCD_WEBUI_SCALE_NODES"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1000 || n%5000 != 0 && n > 5000 {
			t.Fatalf("BCD_WEBUI_SCALE_NODES=%q: accepted are 1000-5000 or a multiple of 5000", s)
		}
		total = n
	}
	e := newEnv(t)
	st := e.svc.Store()
	pool, err := st.Pool(e.ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	per := min(total, 5000)
	start := time.Now()
	var deep string
	for from := 0; from < total; from += per {
		err := st.Write(e.ctx, func(tx *store.Tx) error {
			for i := from; i < from+per; i++ {
				state := []string{"ready", "deployed", "manageable", "failed"}[i%4]
				n := store.Node{ID: store.NewID(time.Now()), TenantID: pool.TenantID, SiteID: pool.SiteID, PoolID: pool.ID,
					Name: fmt.Sprintf("scale-%06d", i), State: state, Power: "off", Maintenance: state == "failed" || state == "manageable", HardwareProfile: "redfish",
					MACs: []string{fmt.Sprintf("02:5c:00:%02x:%02x:%02x", (i>>16)&0xff, (i>>8)&0xff, i&0xff)}}
				if err := tx.InsertNode(e.ctx, &n); err != nil {
					return err
				}
				if i == total-7 {
					deep = n.ID
				}
				if i%50 == 0 {
					if err := tx.AppendEvent(e.ctx, store.Event{TenantID: n.TenantID, NodeID: n.ID, Actor: "test", Kind: "node.seed", ToState: state}); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seeded %d nodes in %v", total, time.Since(start).Round(time.Millisecond))
	admin := e.login(t, e.srv.FirstAdminToken())
	// The default tenant's own token: its dashboard counts the tenant's nodes.
	tenant := e.login(t, e.token(t, "default-viewer", auth.Viewer, "default"))
	perState := fmt.Sprintf(">%d<", total/4)
	inMaintenance := fmt.Sprintf("In maintenance</a>: <strong>%d</strong>", total/2)
	for _, tc := range []struct {
		name, cookie, path, want string
	}{
		{"first page", admin, "/ui/nodes", "scale-000099"},
		{"large page", admin, "/ui/nodes?page_size=1000", "scale-000999"},
		{"filtered", admin, "/ui/nodes?state=failed&maintenance=true", "scale-000003"},
		{"deep page", admin, "/ui/nodes?page_size=5&page=" + url.QueryEscape(pageToken(t, e, deep)), fmt.Sprintf("scale-%06d", total-7)},
		{"dashboard", admin, "/ui/", perState},
		{"tenant dashboard", tenant, "/ui/", perState},
		{"dashboard maintenance", admin, "/ui/", inMaintenance},
		{"tenant dashboard maintenance", tenant, "/ui/", inMaintenance},
		{"events", admin, "/ui/events", "node.seed"},
		{"tenant events", tenant, "/ui/events", "node.seed"},
	} {
		t0 := time.Now()
		r := e.do(t, "GET", tc.path, tc.cookie, nil)
		took := time.Since(t0)
		t.Logf("%s: %v", tc.name, took.Round(time.Millisecond))
		if r.code != 200 || !strings.Contains(r.body, tc.want) {
			t.Fatalf("%s: %d, want %q: %.800s", tc.name, r.code, tc.want, r.body)
		}
		if took > 5*time.Second {
			t.Errorf("%s took %v", tc.name, took)
		}
	}
}

// pageToken is the node list's token of the page after node id (as the service makes it:
// listing one node from just before it gives its token).
func pageToken(t *testing.T, e *env, id string) string {
	t.Helper()
	_, next, err := e.svc.List(e.ctx, e.admin, metal.ListInput{PageSize: 1})
	if err != nil || next == "" {
		t.Fatal("no page token", err)
	}
	// Tokens are opaque: walk from the first page in pages of 10,000 to the one holding id.
	in := metal.ListInput{PageSize: metal.MaxPageSize}
	for {
		list, next, err := e.svc.List(e.ctx, e.admin, in)
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range list {
			if n.ID == id {
				one, tok, err := e.svc.List(e.ctx, e.admin, metal.ListInput{PageSize: i, PageToken: in.PageToken})
				if i == 0 || err != nil || len(one) != i {
					t.Fatal("cannot make a page token before", id, err)
				}
				return tok
			}
		}
		if next == "" {
			t.Fatal("node not listed", id)
		}
		in.PageToken = next
	}
}

// TestSecureCookieOverTLS: with the API on TLS the session cookie is Secure.
func TestSecureCookieOverTLS(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, server.Config{APITLSCert: certFile, APITLSKey: keyFile})
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	e.transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
	if !strings.HasPrefix(e.srv.URL(), "https://") {
		t.Fatalf("server URL %s", e.srv.URL())
	}
	r := e.do(t, "POST", "/ui/login", "", url.Values{"token": {e.srv.FirstAdminToken()}})
	if r.code != http.StatusSeeOther || r.cookie == nil || !r.cookie.Secure || !r.cookie.HttpOnly || r.cookie.SameSite != http.SameSiteStrictMode {
		t.Fatalf("login over TLS: %d cookie %+v", r.code, r.cookie)
	}
}
