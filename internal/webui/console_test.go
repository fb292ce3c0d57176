package webui_test

import (
	"bufio"
	"encoding/base64"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"bcd/internal/auth"
	"bcd/internal/metal"
	"bcd/internal/server"
)

// sseEvent is one server-sent event.
type sseEvent struct{ name, data string }

// The node's console in the web UI: the node page links it for an operator; the page carries
// its script and CSRF token; its stream opens a session (the site agent's side played through
// the server's hub) and passes status and output as events; typed input needs the session's
// CSRF token and the opener's session; leaving the page closes the session. A viewer gets none
// of it.
func TestConsolePage(t *testing.T) {
	e := newEnvWith(t, server.Config{GatewayListen: "127.0.0.1:0"})
	hub := e.srv.Consoles()
	n, err := e.svc.Enroll(e.ctx, e.admin, metal.EnrollInput{Name: "sol", Pool: "default", MACs: []string{"02:ee:00:00:c0:01"},
		BMC: metal.BMCInput{Driver: "ipmi", Address: "10.99.0.1:623", Username: "root", Password: bmcPassword}})
	if err != nil {
		t.Fatal(err)
	}
	op := e.login(t, e.token(t, "ops", auth.Operator, ""))
	viewer := e.login(t, e.token(t, "ro", auth.Viewer, ""))

	if r := e.do(t, "GET", "/ui/nodes/"+n.ID, op, nil); !strings.Contains(r.body, "/ui/nodes/"+n.ID+"/console") {
		t.Errorf("the node page links no console: %.300s", r.body)
	}
	page := e.do(t, "GET", "/ui/nodes/"+n.ID+"/console", op, nil)
	if page.code != http.StatusOK || !strings.Contains(page.body, `src="/ui/static/console.js"`) || !strings.Contains(page.body, `data-stream="/ui/nodes/`+n.ID+`/console/stream"`) {
		t.Fatalf("console page: %d %.500s", page.code, page.body)
	}
	token := regexpFind(t, page.body, `data-csrf="([^"]+)"`)
	if r := e.do(t, "GET", "/ui/nodes/"+n.ID+"/console", viewer, nil); r.code != http.StatusForbidden {
		t.Errorf("a viewer's console page: %d", r.code)
	}
	if r := e.do(t, "GET", "/ui/nodes/"+n.ID+"/console/stream", viewer, nil); r.code != http.StatusForbidden || len(hub.IDs()) != 0 {
		t.Errorf("a viewer's console stream: %d, %d sessions", r.code, len(hub.IDs()))
	}

	// The stream: a session.
	req, _ := http.NewRequestWithContext(e.ctx, "GET", e.srv.URL()+"/ui/nodes/"+n.ID+"/console/stream", nil)
	req.AddCookie(&http.Cookie{Name: "bcd_ui_session", Value: op})
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("stream: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	events := make(chan sseEvent, 16)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(res.Body)
		var ev sseEvent
		for sc.Scan() {
			switch l := sc.Text(); {
			case strings.HasPrefix(l, "event: "):
				ev.name = strings.TrimPrefix(l, "event: ")
			case strings.HasPrefix(l, "data: "):
				ev.data = strings.TrimPrefix(l, "data: ")
			case l == "":
				events <- ev
				ev = sseEvent{}
			}
		}
	}()
	next := func() sseEvent {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("the stream ended")
			}
			return ev
		case <-time.After(20 * time.Second):
			t.Fatal("no event")
		}
		return sseEvent{}
	}
	id := next()
	if id.name != "session" || id.data == "" {
		t.Fatalf("first event %+v", id)
	}
	if ev := next(); ev.name != "status" || !strings.Contains(ev.data, "waiting for a site agent") {
		t.Fatalf("second event %+v", ev)
	}
	end, err := hub.Attach(e.ctx, id.data, "agent-9")
	if err != nil {
		t.Fatal(err)
	}
	if ev := next(); ev.name != "status" || ev.data != "connected through site agent agent-9" {
		t.Fatalf("after attach %+v", ev)
	}
	if err := end.Output(e.ctx, []byte("sol login: \x1b[0m")); err != nil {
		t.Fatal(err)
	}
	if ev := next(); ev.name != "data" || ev.data != base64.StdEncoding.EncodeToString([]byte("sol login: \x1b[0m")) {
		t.Fatalf("output event %+v", ev)
	}

	input := "/ui/nodes/" + n.ID + "/console/input"
	form := url.Values{"csrf": {token}, "session": {id.data}, "data": {"root\r"}}
	if r := e.do(t, "POST", input, op, form, "Sec-Fetch-Site", "same-origin"); r.code != http.StatusNoContent {
		t.Fatalf("input: %d %s", r.code, r.body)
	}
	select {
	case b := <-end.Input():
		if string(b) != "root\r" {
			t.Errorf("the agent got %q", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("input never reached the agent")
	}
	other := e.login(t, e.token(t, "ops2", auth.Operator, ""))
	otherToken := regexpFind(t, e.do(t, "GET", "/ui/nodes/"+n.ID+"/console", other, nil).body, `data-csrf="([^"]+)"`)
	for _, c := range []struct {
		name, cookie string
		form         url.Values
		code         int
	}{
		{"no CSRF token", op, url.Values{"session": {id.data}, "data": {"x"}}, http.StatusForbidden},
		{"another session's CSRF token", other, url.Values{"csrf": {token}, "session": {id.data}, "data": {"x"}}, http.StatusForbidden},
		{"another operator's session", other, url.Values{"csrf": {otherToken}, "session": {id.data}, "data": {"x"}}, http.StatusForbidden},
		{"no such session", op, url.Values{"csrf": {token}, "session": {"nope"}, "data": {"x"}}, http.StatusNotFound},
		{"empty", op, url.Values{"csrf": {token}, "session": {id.data}, "data": {""}}, http.StatusBadRequest},
	} {
		if r := e.do(t, "POST", input, c.cookie, c.form, "Sec-Fetch-Site", "same-origin"); r.code != c.code {
			t.Errorf("input, %s: %d %s, want %d", c.name, r.code, r.body, c.code)
		}
	}

	// Leaving the page closes the session for the agent.
	res.Body.Close()
	select {
	case <-end.Closed():
	case <-time.After(10 * time.Second):
		t.Fatal("the page left and the session stayed open")
	}
}

// regexpFind is the first group of pattern in s.
func regexpFind(t *testing.T, s, pattern string) string {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("%s not found in %.300s", pattern, s)
	}
	return m[1]
}
