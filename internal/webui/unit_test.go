package webui

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"bcd/internal/metal"
	"bcd/internal/store"
)

func TestParsePageSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		err  string
	}{
		{"", defaultPageSize, ""},
		{"1", 1, ""},
		{"1000", 1000, ""},
		{"0", 0, "accepted are whole numbers from 1 to 1000"},
		{"1001", 0, "accepted are whole numbers from 1 to 1000"},
		{"-5", 0, "accepted are"},
		{"ten", 0, `page_size "ten"`},
	} {
		got, err := parsePageSize(tc.in)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %d %v, want %d %q", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestStepStatus(t *testing.T) {
	for _, tc := range []struct {
		name  string
		wf    store.Workflow
		phase string
		i     int
		want  string
	}{
		{"before the index", store.Workflow{State: "running", Phase: "steps", StepIndex: 2}, "steps", 1, "done"},
		{"at the index", store.Workflow{State: "running", Phase: "steps", StepIndex: 2}, "steps", 2, "running"},
		{"after the index", store.Workflow{State: "running", Phase: "steps", StepIndex: 2}, "steps", 3, "pending"},
		{"cleanup while steps run", store.Workflow{State: "running", Phase: "steps", StepIndex: 2}, "cleanup", 0, "pending"},
		{"steps while cleanup runs", store.Workflow{State: "cleaning", Phase: "cleanup", StepIndex: 0}, "steps", 3, "ended"},
		{"cleanup at the index", store.Workflow{State: "cleaning", Phase: "cleanup", StepIndex: 0}, "cleanup", 0, "running"},
		{"failed at the index", store.Workflow{State: "failed", Phase: "steps", StepIndex: 1}, "steps", 1, "failed"},
		{"after a failure", store.Workflow{State: "failed", Phase: "steps", StepIndex: 1}, "steps", 2, "not run"},
		{"succeeded", store.Workflow{State: "succeeded", Phase: "cleanup", StepIndex: 1}, "steps", 4, "done"},
		{"no phase recorded", store.Workflow{State: "running", StepIndex: 0}, "steps", 0, "running"},
	} {
		if got := stepStatus(tc.wf, tc.phase, tc.i); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestCheckPost(t *testing.T) {
	const tok = "bcda_sessiontoken"
	good := csrfToken(tok)
	if good == csrfToken("bcda_othertoken") || good != csrfToken(tok) || strings.Contains(good, tok) {
		t.Fatal("the CSRF token must be the session's, stable, and not hold the token")
	}
	for _, tc := range []struct {
		name    string
		form    url.Values
		headers map[string]string
		want    string // "" allowed
	}{
		{"token", url.Values{"csrf": {good}}, nil, ""},
		{"token, same origin", url.Values{"csrf": {good}}, map[string]string{"Origin": "http://ui.test", "Sec-Fetch-Site": "same-origin"}, ""},
		{"no token", url.Values{}, nil, "no CSRF token"},
		{"empty token", url.Values{"csrf": {""}}, nil, "no CSRF token"},
		{"wrong token", url.Values{"csrf": {csrfToken("bcda_othertoken")}}, nil, "does not belong to this session"},
		{"cross-site", url.Values{"csrf": {good}}, map[string]string{"Sec-Fetch-Site": "cross-site"}, "another site"},
		{"same-site, other origin", url.Values{"csrf": {good}}, map[string]string{"Sec-Fetch-Site": "same-site"}, "another site"},
		{"other origin", url.Values{"csrf": {good}}, map[string]string{"Origin": "http://evil.test"}, "another origin"},
		{"null origin", url.Values{"csrf": {good}}, map[string]string{"Origin": "null"}, "another origin"},
	} {
		r := httptest.NewRequest(http.MethodPost, "http://ui.test/ui/batches/x/approve", strings.NewReader(tc.form.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		if got := checkPost(r, good); (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestCookieAttributes: the session cookie is HttpOnly, SameSite=Strict, scoped to /ui/, and
// Secure when the listener is TLS; logging out expires it with the same attributes.
func TestCookieAttributes(t *testing.T) {
	for _, secure := range []bool{false, true} {
		u := &UI{secure: secure}
		for _, set := range []func(http.ResponseWriter){
			func(w http.ResponseWriter) { u.setCookie(w, "bcda_x") },
			u.clearCookie,
		} {
			rec := httptest.NewRecorder()
			set(rec)
			cs := rec.Result().Cookies()
			if len(cs) != 1 {
				t.Fatalf("%d cookies", len(cs))
			}
			c := cs[0]
			if c.Name != cookieName || !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/ui/" || c.Secure != secure {
				t.Errorf("secure=%v: %s", secure, fmt.Sprint(rec.Header()["Set-Cookie"]))
			}
		}
	}
}

func TestCommandViews(t *testing.T) {
	const s = int64(1_000_000)               // a second in store time
	got := commandViews([]metal.NodeCommand{ // newest first, as the service lists them
		{Command: store.Command{Kind: "bmc.power", State: "queued", CreatedAt: 90 * s}},
		{Command: store.Command{Kind: "disk.wipe", State: "succeeded", CreatedAt: 10 * s, DeliveredAt: 10*s + 1500, FinishedAt: 70*s + 1500}},
		{Command: store.Command{Kind: "bmc.query", State: "lost", CreatedAt: 2 * s, DeliveredAt: 3*s + s/4}},
	})
	want := []struct{ kind, waited, ran string }{{"bmc.query", "1.3s", ""}, {"disk.wipe", "2ms", "1m0s"}, {"bmc.power", "", ""}}
	if len(got) != len(want) {
		t.Fatalf("%d commands", len(got))
	}
	for i, w := range want {
		if got[i].Kind != w.kind || got[i].Waited != w.waited || got[i].Ran != w.ran {
			t.Errorf("command %d: %s waited %q ran %q, want %s %q %q", i, got[i].Kind, got[i].Waited, got[i].Ran, w.kind, w.waited, w.ran)
		}
	}
}
