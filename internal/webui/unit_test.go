package webui

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"bcd/internal/store"
)

// fakeLog is an event log of the given ids, read as the service reads it.
type fakeLog struct {
	ids   []uint64
	reads int
}

func (f *fakeLog) fetch(_ context.Context, after uint64, limit int) ([]store.Event, error) {
	f.reads++
	i, _ := slices.BinarySearch(f.ids, after+1)
	var out []store.Event
	for ; i < len(f.ids) && len(out) < limit; i++ {
		out = append(out, store.Event{ID: f.ids[i]})
	}
	return out, nil
}

func TestLastEvents(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	dense := func(n int) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			out[i] = uint64(i + 1)
		}
		return out
	}
	sparse := func(n int, every uint64) []uint64 {
		var out []uint64
		for id := uint64(1); len(out) < n; id += 1 + r.Uint64N(every) {
			out = append(out, id)
		}
		return out
	}
	// A tenant's events: a burst long ago, then a few recent ones far apart.
	bursty := append(dense(5000), 900_000, 1_500_000, 4_000_000)
	for _, tc := range []struct {
		name string
		ids  []uint64
		n    int
	}{
		{"empty", nil, 10},
		{"one", []uint64{7}, 10},
		{"fewer than asked", dense(5), 10},
		{"dense", dense(100_000), 50},
		{"sparse", sparse(20_000, 200), 100},
		{"very sparse", sparse(300, 1_000_000), 100},
		{"bursty", bursty, 10},
		{"large ids", []uint64{1 << 40, 1<<40 + 5, 1 << 62}, 2},
		{"none asked", dense(10), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeLog{ids: tc.ids}
			got, err := lastEvents(t.Context(), f.fetch, tc.n)
			if err != nil {
				t.Fatal(err)
			}
			var want []uint64
			if tc.n > 0 {
				want = slices.Clone(tc.ids[max(0, len(tc.ids)-tc.n):])
			}
			slices.Reverse(want)
			var ids []uint64
			for _, e := range got {
				ids = append(ids, e.ID)
			}
			if !slices.Equal(ids, want) {
				t.Fatalf("got %v, want %v", ids, want)
			}
			// Bounded: two searches of 64 one-event reads, then a few windows.
			if f.reads > 200 {
				t.Fatalf("%d reads of the log", f.reads)
			}
		})
	}
}

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
