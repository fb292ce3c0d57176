package redfish_test

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"bcd/internal/bmc"
	"bcd/internal/bmc/redfish"

	"github.com/stmcginnis/gofish/schemas"
)

// TestSessionLoggedOutWhenCallerGivesUp: the caller's context ends after the driver created a
// session and before gofish finished connecting with it (it reads the service root again). The
// session must still be deleted: BMCs hold a handful of sessions, and each one left behind holds
// a slot until it times out.
func TestSessionLoggedOutWhenCallerGivesUp(t *testing.T) {
	s := newScripted()
	withMachine(s, &machine{state: "On"})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var roots atomic.Int32
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.TrimSuffix(r.URL.Path, "/") == "/redfish/v1" && roots.Add(1) == 2 {
			cancel() // the caller gives up while gofish reads the service root with the new session
			<-r.Context().Done()
			return
		}
		s.ServeHTTP(w, r)
	}))
	_, err := redfish.New(ctx, bmc.Endpoint{Address: url, Username: "u", Password: "p"}, quirkOpts())
	if err == nil {
		t.Fatal("New succeeded with its context cancelled")
	}
	if n := len(s.requests("POST /redfish/v1/SessionService/Sessions")); n != 1 {
		t.Fatalf("%d sessions created, want 1", n)
	}
	if got, want := s.requests("DELETE"), []string{"DELETE /redfish/v1/SessionService/Sessions/1 "}; !slices.Equal(got, want) {
		t.Fatalf("deletes %q, want %q: the session was left on the BMC", got, want)
	}
}

// TestHugeAnswerIsBounded: a BMC answers an error with an endless body (a faulty BMC, a proxy's
// error page). The driver reads a bounded part of it, and the error it returns (which ends up in
// events and logs) stays short and on one line.
func TestHugeAnswerIsBounded(t *testing.T) {
	const size = 64 << 20
	s := newScripted()
	withMachine(s, &machine{state: "On"})
	var written atomic.Int64
	done := make(chan struct{}, 1)
	url := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != sys1 {
			s.ServeHTTP(w, r)
			return
		}
		defer func() {
			select {
			case done <- struct{}{}:
			default:
			}
		}()
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusInternalServerError)
		chunk := bytes.Repeat([]byte("<p>internal error\n"), 4096)
		for written.Load() < size {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	c := dial(t, url, quirkOpts())
	_, err := c.GetPower(ctx(t))
	if err == nil {
		t.Fatal("GetPower succeeded on an error answer")
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the BMC's answer was never cut short")
	}
	if n := written.Load(); n >= size/2 {
		t.Errorf("the driver read %d bytes of a %d-byte answer", n, size)
	}
	if msg := err.Error(); len(msg) > 2048 || strings.ContainsAny(msg, "\r\n") {
		t.Errorf("error of %d bytes (multi-line: %v): %.200q…", len(msg), strings.ContainsAny(msg, "\r\n"), msg)
	}
}

// TestBMCMessageClipped: a BMC's long, multi-line message is cut and put on one line.
func TestBMCMessageClipped(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
	}{
		{"html page", "<html>\n" + strings.Repeat("<p>boom</p>\r\n", 10000) + "</html>"},
		{"extended infos", `{"error":{"@Message.ExtendedInfo":[` + strings.Repeat(`{"MessageId":"Base.1.0.X","Message":"long\nline"},`, 2000) + `{}]}}`},
		{"multibyte at the cut", strings.Repeat("é", 2000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := redfish.BMCMessage(schemas.ConstructError(500, []byte(tc.body)))
			if len(msg) > 700 || strings.ContainsAny(msg, "\r\n") || !strings.HasPrefix(msg, "HTTP 500: ") {
				t.Fatalf("message of %d bytes: %.200q", len(msg), msg)
			}
			if !utf8.ValidString(msg) {
				t.Fatalf("message cut inside a character: %q", msg[len(msg)-40:])
			}
		})
	}
}
