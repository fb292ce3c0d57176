package webui_test

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"bcd/internal/auth"
	"bcd/internal/metal"
	"bcd/internal/provision"
	"bcd/internal/store"
)

// pageVerbs are the verbs the node page has forms for (delete and enroll have their own calls).
var pageVerbs = []string{"manage", "inspect", "provide", "deploy", "undeploy", "rescue", "unrescue", "retire", "recover", "abort", "maintenance", "power"}

// placeNode inserts a node of the default pool in a given state, no workflow and no wake-up:
// the reconciler leaves it alone during a test, so its version only moves with the test's verbs.
func (e *env) placeNode(t *testing.T, name, state, target, failedFrom string, maintenance bool, i int) store.Node {
	t.Helper()
	st := e.svc.Store()
	pool, err := st.Pool(e.ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	n := store.Node{ID: store.NewID(time.Now()), TenantID: pool.TenantID, SiteID: pool.SiteID, PoolID: pool.ID, Name: name, State: state,
		TargetState: target, FailedFrom: failedFrom, Maintenance: maintenance, Power: "off", HardwareProfile: "redfish",
		BMCAddress: fmt.Sprintf("https://10.98.0.%d", i), MACs: []string{fmt.Sprintf("02:ab:00:00:00:%02x", i)}}
	if maintenance {
		n.MaintenanceReason = "placed"
	}
	if err := st.Write(e.ctx, func(tx *store.Tx) error { return tx.InsertNode(e.ctx, &n) }); err != nil {
		t.Fatal(err)
	}
	got, err := e.svc.Get(e.ctx, e.admin, n.ID)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func (e *env) node(t *testing.T, id string) store.Node {
	t.Helper()
	n, err := e.svc.Get(e.ctx, e.admin, id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

var (
	verbFormRe = regexp.MustCompile(`action="/ui/nodes/[^/"]+/verb/([a-z]+)"`)
	versionRe  = regexp.MustCompile(`name="version" value="(\d+)"`)
)

// verbForms lists the verbs of a node page's forms.
func verbForms(page resp) []string {
	var out []string
	for _, m := range verbFormRe.FindAllStringSubmatch(page.body, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestNodeVerbForms: an operator's node page has a form for each verb the node accepts now
// (provision.Accepted, as the API's allowed_verbs) and none other; a viewer's has none.
func TestNodeVerbForms(t *testing.T) {
	e := newEnv(t)
	operator := e.login(t, e.token(t, "ops", auth.Operator, ""))
	viewer := e.login(t, e.token(t, "watcher", auth.Viewer, ""))
	seen := map[string]bool{}
	for i, tc := range []struct {
		state, target, failedFrom string
		maintenance               bool
	}{
		{"ready", "", "", false},
		{"manageable", "", "", false},
		{"deployed", "", "", false},
		{"rescue", "", "", false},
		{"failed", "deployed", "deploying", true},
		{"deploying", "deployed", "", false},
		{"ready", "", "", true},
		{"retired", "", "", false},
	} {
		name := fmt.Sprintf("%s-%d", tc.state, i)
		t.Run(name, func(t *testing.T) {
			n := e.placeNode(t, name, tc.state, tc.target, tc.failedFrom, tc.maintenance, i+1)
			var want []string
			for _, v := range provision.Accepted(metal.PNode(n)) {
				if slices.Contains(pageVerbs, string(v)) {
					want = append(want, string(v))
				}
			}
			page := e.do(t, "GET", "/ui/nodes/"+n.ID, operator, nil)
			got := verbForms(page)
			slices.Sort(got)
			slices.Sort(want)
			if page.code != 200 || !slices.Equal(got, want) {
				t.Fatalf("%d: forms %v, want %v", page.code, got, want)
			}
			for _, v := range got {
				seen[v] = true
			}
			if m := versionRe.FindAllStringSubmatch(page.body, -1); len(m) != len(want) || len(m) > 0 && m[0][1] != strconv.FormatUint(n.Version, 10) {
				t.Fatalf("forms carry versions %v, want %d each", m, n.Version)
			}
			if slices.Contains(want, "deploy") && !strings.Contains(page.body, `<option value="default">default</option>`) {
				t.Fatalf("deploy form without the default profile: %.3000s", page.body)
			}
			if tc.maintenance && slices.Contains(want, "maintenance") && !strings.Contains(page.body, "Turn maintenance off") ||
				!tc.maintenance && slices.Contains(want, "maintenance") && !strings.Contains(page.body, "Turn maintenance on") {
				t.Fatalf("maintenance form does not offer the other setting: %.3000s", page.body)
			}
			vp := e.do(t, "GET", "/ui/nodes/"+n.ID, viewer, nil)
			if vp.code != 200 || len(verbForms(vp)) != 0 || strings.Contains(vp.body, `name="confirm"`) || strings.Contains(vp.body, "Actions") {
				t.Fatalf("a viewer's node page has action forms: %d %v", vp.code, verbForms(vp))
			}
		})
	}
	for _, v := range pageVerbs {
		if !seen[v] {
			t.Errorf("no node state showed a %s form", v)
		}
	}
}

// TestMaintenanceThroughTheUI: maintenance on and off through the UI change the node as the
// API's Maintenance does (the flag, its reason, an event with the reason and the token as
// actor); a form of a page older than the node is refused with the service's stale error.
func TestMaintenanceThroughTheUI(t *testing.T) {
	e := newEnv(t)
	n := e.placeNode(t, "box", "ready", "", "", false, 1)
	operator := e.login(t, e.token(t, "ops", auth.Operator, ""))
	path := "/ui/nodes/" + n.ID
	page := e.do(t, "GET", path, operator, nil)
	token := csrf(t, page)
	ver := strconv.FormatUint(n.Version, 10)

	r := e.do(t, "POST", path+"/verb/maintenance", operator, url.Values{"csrf": {token}, "version": {ver}, "on": {"true"}, "reason": {"disk swap"}})
	if r.code != http.StatusSeeOther || r.header.Get("Location") != path+"?done=maintenance-on" {
		t.Fatalf("maintenance on: %d %v %.600s", r.code, r.header, r.body)
	}
	on := e.node(t, n.ID)
	if !on.Maintenance || on.MaintenanceReason != "disk swap" || on.Version <= n.Version || on.State != "ready" {
		t.Fatalf("after maintenance on: maintenance %v %q version %d state %s", on.Maintenance, on.MaintenanceReason, on.Version, on.State)
	}
	if p := e.do(t, "GET", r.header.Get("Location"), operator, nil); !strings.Contains(p.body, "Maintenance is on.") || !strings.Contains(p.body, "Turn maintenance off") {
		t.Fatalf("page after maintenance on: %.2000s", p.body)
	}
	evs, err := e.svc.Events(e.ctx, e.admin, n.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(evs, func(ev store.Event) bool { return ev.Kind == "node.maintenance" }); i < 0 || evs[i].Reason != "disk swap" || evs[i].Actor != "token:ops" {
		t.Fatalf("no node.maintenance event with the reason and actor: %+v", evs)
	}

	// The first page's form again: the node changed since, so the service refuses it.
	stale := e.do(t, "POST", path+"/verb/maintenance", operator, url.Values{"csrf": {token}, "version": {ver}, "on": {"false"}, "reason": {"done"}})
	want := fmt.Sprintf("aborted: maintenance %s: node box is at version %d, not %d", n.ID, on.Version, n.Version)
	if stale.code != http.StatusConflict || !strings.Contains(stale.body, want) {
		t.Fatalf("stale form: %d, want 409 with %q: %.2000s", stale.code, want, stale.body)
	}
	if got := e.node(t, n.ID); got.Version != on.Version || !got.Maintenance {
		t.Fatalf("a stale form changed the node: version %d maintenance %v", got.Version, got.Maintenance)
	}
	// The refusal shows the node read again: its forms carry the new version.
	if m := versionRe.FindStringSubmatch(stale.body); m == nil || m[1] != strconv.FormatUint(on.Version, 10) {
		t.Fatalf("the refusal's page does not carry the node's new version: %v", m)
	}

	r = e.do(t, "POST", path+"/verb/maintenance", operator, url.Values{"csrf": {token}, "version": {strconv.FormatUint(on.Version, 10)}, "on": {"false"}, "reason": {"swapped"}})
	if r.code != http.StatusSeeOther || r.header.Get("Location") != path+"?done=maintenance-off" {
		t.Fatalf("maintenance off: %d %v %.600s", r.code, r.header, r.body)
	}
	if off := e.node(t, n.ID); off.Maintenance || off.MaintenanceReason != "" || off.Version <= on.Version {
		t.Fatalf("after maintenance off: maintenance %v %q version %d", off.Maintenance, off.MaintenanceReason, off.Version)
	}
	evs, err = e.svc.Events(e.ctx, e.admin, n.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(evs, func(ev store.Event) bool { return ev.Kind == "node.maintenance" && ev.Reason == "swapped" }); i < 0 {
		t.Fatalf("no node.maintenance event with reason swapped: %+v", evs)
	}
}

// TestNodeVerbRefusals: a destructive verb without its confirmation, a form without its CSRF
// token, a viewer's form, a form without the page's version, an unknown verb and a verb the
// node does not accept are refused and change nothing; a confirmed retire then moves the node,
// with its reason in the event.
func TestNodeVerbRefusals(t *testing.T) {
	e := newEnv(t)
	n := e.placeNode(t, "box", "ready", "", "", false, 1)
	operator := e.login(t, e.token(t, "ops", auth.Operator, ""))
	viewer := e.login(t, e.token(t, "watcher", auth.Viewer, ""))
	path := "/ui/nodes/" + n.ID
	token := csrf(t, e.do(t, "GET", path, operator, nil))
	viewerToken := csrf(t, e.do(t, "GET", path, viewer, nil))
	ver := strconv.FormatUint(n.Version, 10)
	for _, tc := range []struct {
		name, cookie, verb string
		form               url.Values
		code               int
		msg                string
	}{
		{"retire without confirmation", operator, "retire", url.Values{"csrf": {token}, "version": {ver}}, 400, "retire needs confirmation: check &#34;I understand&#34;"},
		{"retire confirmed otherwise", operator, "retire", url.Values{"csrf": {token}, "version": {ver}, "confirm": {"on"}}, 400, "retire needs confirmation"},
		{"power without confirmation", operator, "power", url.Values{"csrf": {token}, "version": {ver}, "action": {"off"}}, 400, "power needs confirmation"},
		{"deploy without confirmation", operator, "deploy", url.Values{"csrf": {token}, "version": {ver}, "image": {"x"}}, 400, "deploy needs confirmation"},
		{"no CSRF token", operator, "retire", url.Values{"version": {ver}, "confirm": {"yes"}}, 403, "the form carried no CSRF token"},
		{"another session's CSRF token", operator, "manage", url.Values{"csrf": {viewerToken}, "version": {ver}}, 403, "does not belong to this session"},
		{"viewer", viewer, "manage", url.Values{"csrf": {viewerToken}, "version": {ver}}, 403, "permission_denied: token &#34;watcher&#34; has role viewer, which does not allow operate"},
		{"viewer confirmed", viewer, "retire", url.Values{"csrf": {viewerToken}, "version": {ver}, "confirm": {"yes"}}, 403, "permission_denied: "},
		{"no version", operator, "manage", url.Values{"csrf": {token}}, 400, "the form must carry the node version its page showed"},
		{"bad maintenance setting", operator, "maintenance", url.Values{"csrf": {token}, "version": {ver}, "on": {"maybe"}}, 400, "accepted are true (turn maintenance on) or false"},
		{"unknown verb", operator, "explode", url.Values{"csrf": {token}, "version": {ver}}, 404, "accepted are manage, inspect, provide, deploy"},
		{"not accepted now", operator, "undeploy", url.Values{"csrf": {token}, "version": {ver}, "confirm": {"yes"}}, 409, "failed_precondition: undeploy " + n.ID + ": undeploy refused: node is ready"},
		{"stale version", operator, "retire", url.Values{"csrf": {token}, "version": {"999"}, "confirm": {"yes"}}, 409, "aborted: "},
		{"unknown image", operator, "deploy", url.Values{"csrf": {token}, "version": {ver}, "confirm": {"yes"}, "image": {"nope"}}, 400, "invalid_argument: "},
		// Larger than the service takes, smaller than the form's bound: the form is read whole,
		// and the service's refusal (here of the image, checked first) never quotes the
		// user-data, nor does the page around it.
		{"user-data too large", operator, "deploy", url.Values{"csrf": {token}, "version": {ver}, "confirm": {"yes"}, "image": {"nope"},
			"user_data": {"#cloud-config\n# ud-secret-marker\n" + strings.Repeat("x", 70<<10)}}, 400, "invalid_argument: image: no catalog image named"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(t, "POST", path+"/verb/"+tc.verb, tc.cookie, tc.form)
			if r.code != tc.code || !strings.Contains(r.body, tc.msg) {
				t.Fatalf("%d %.2000s, want %d with %q", r.code, r.body, tc.code, tc.msg)
			}
			if got := e.node(t, n.ID); got.Version != n.Version || got.State != "ready" {
				t.Fatalf("a refused form changed the node: version %d state %s", got.Version, got.State)
			}
			if strings.Contains(r.body, "ud-secret-marker") {
				t.Fatalf("the refusal shows the user-data: %.2000s", r.body)
			}
			if tc.cookie == viewer && len(verbForms(r)) != 0 {
				t.Fatalf("the viewer's refusal shows action forms: %v", verbForms(r))
			}
		})
	}
	r := e.do(t, "POST", path+"/verb/retire", operator, url.Values{"csrf": {token}, "version": {ver}, "confirm": {"yes"}, "reason": {"end of life"}})
	if r.code != http.StatusSeeOther || r.header.Get("Location") != path+"?done=retire" {
		t.Fatalf("retire: %d %v %.600s", r.code, r.header, r.body)
	}
	if got := e.node(t, n.ID); got.State != "retiring" || got.TargetState != "retired" {
		t.Fatalf("after retire: %s → %s", got.State, got.TargetState)
	}
	evs, err := e.svc.Events(e.ctx, e.admin, n.ID, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(evs, func(ev store.Event) bool { return ev.Kind == "node.retire" }); i < 0 || evs[i].Reason != "end of life" || evs[i].Actor != "token:ops" {
		t.Fatalf("no node.retire event with the reason: %+v", evs)
	}
	if p := e.do(t, "GET", r.header.Get("Location"), operator, nil); !strings.Contains(p.body, "Retire accepted") {
		t.Fatalf("page after retire: %.1500s", p.body)
	}
}

// TestPowerWaitsForApproval: where the pool requires an approval, power through the UI is
// held on a one-node batch, and the node page says so with a link to it; without, the command
// is queued. A batch named in the URL is shown only as the service reads it for the caller.
func TestPowerWaitsForApproval(t *testing.T) {
	e := newEnv(t)
	free := e.placeNode(t, "free", "ready", "", "", false, 1)
	operator := e.login(t, e.token(t, "ops", auth.Operator, ""))
	token := csrf(t, e.do(t, "GET", "/ui/nodes/"+free.ID, operator, nil))
	r := e.do(t, "POST", "/ui/nodes/"+free.ID+"/verb/power", operator, url.Values{"csrf": {token}, "version": {strconv.FormatUint(free.Version, 10)},
		"confirm": {"yes"}, "action": {"cycle"}, "reason": {"hung"}})
	if r.code != http.StatusSeeOther || r.header.Get("Location") != "/ui/nodes/"+free.ID+"?done=power" {
		t.Fatalf("power: %d %v %.600s", r.code, r.header, r.body)
	}
	if _, err := e.svc.SetApprovalPolicy(e.ctx, e.admin, "pool", "default", 1); err != nil {
		t.Fatal(err)
	}
	held := e.placeNode(t, "held", "ready", "", "", false, 2)
	r = e.do(t, "POST", "/ui/nodes/"+held.ID+"/verb/power", operator, url.Values{"csrf": {token}, "version": {strconv.FormatUint(held.Version, 10)},
		"confirm": {"yes"}, "action": {"off"}, "reason": {"move rack"}})
	loc := r.header.Get("Location")
	m := regexp.MustCompile(`^/ui/nodes/` + held.ID + `\?done=power-held&batch=([A-Za-z0-9_-]+)$`).FindStringSubmatch(loc)
	if r.code != http.StatusSeeOther || m == nil {
		t.Fatalf("power with approvals: %d %q %.600s", r.code, loc, r.body)
	}
	b, _, err := e.svc.Batch(e.ctx, e.admin, m[1], 0)
	if err != nil || b.State != store.BatchPending || b.Reason != "move rack" {
		t.Fatalf("batch %+v %v, want pending with the reason", b, err)
	}
	p := e.do(t, "GET", loc, operator, nil)
	if !strings.Contains(p.body, "waits for approval") || !strings.Contains(p.body, `href="/ui/batches/`+b.ID+`"`) {
		t.Fatalf("page after a held power: %.2000s", p.body)
	}
	// A batch id made up in the URL is not shown.
	p = e.do(t, "GET", "/ui/nodes/"+held.ID+"?done=power-held&batch=%3Cb%3Einjected", operator, nil)
	if p.code != 200 || strings.Contains(p.body, "injected") || strings.Contains(p.body, "/ui/batches/<") {
		t.Fatalf("a batch from the URL is rendered: %.2000s", p.body)
	}
	if p := e.do(t, "GET", "/ui/nodes/"+held.ID+"?done=%3Cb%3Efree+text", operator, nil); strings.Contains(p.body, "free text") || strings.Contains(p.body, "<b>") {
		t.Fatalf("free text from the URL is rendered: %.2000s", p.body)
	}
}
