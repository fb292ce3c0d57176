package image

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"bcd/internal/testlog"
)

// A signed image URL's query token (or a redirect's) appears in no error and no log line of
// Fetch, whatever goes wrong; the host and path still say which image it was.
func TestFetchRedactsURLTokens(t *testing.T) {
	const secret = "SignedTokenSecret"
	img := diskImage(mib, 7)
	stalls := stallServer(t, img)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/img":
			http.ServeContent(w, r, "img", time.Time{}, bytes.NewReader(img))
		case "/redirect":
			http.Redirect(w, r, "/missing?sig=Redirect"+secret, http.StatusFound)
		case "/redirect-away":
			http.Redirect(w, r, "http://127.0.0.1:1/img?sig=Away"+secret, http.StatusFound) // nothing listens there
		default:
			http.NotFound(w, r)
		}
	}))
	defer s.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	cases := []struct {
		name, url, want string // want: "" succeeds, else in the error
		idle            time.Duration
	}{
		{"written", s.URL + "/img?sig=" + secret, "", 0},
		{"not found", s.URL + "/missing?sig=" + secret, "/missing?[redacted]: HTTP 404", 0},
		{"redirect to a signed URL not found", s.URL + "/redirect?sig=" + secret, "/redirect?[redacted]: HTTP 404", 0},
		{"redirect to a signed URL refused", s.URL + "/redirect-away?sig=" + secret, "connection refused", 0},
		{"refused", gone.URL + "/img?sig=" + secret, "connection refused", 0},
		{"stalled", stalls.URL + "/headers?sig=" + secret, "/headers?[redacted] sent nothing", 200 * time.Millisecond},
		{"does not parse", "http://127.0.0.1:1/%zz?sig=" + secret, "building the request for [unparseable URL]", 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var logs lockedBuffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			_, err := Fetch(context.Background(), log, Spec{URL: c.url, SHA256: sha256Hex(img)}, newTarget(t, 2*mib), Options{IdleTimeout: c.idle}, nil)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("failed: %v", err)
			case c.want == "":
			case err == nil:
				t.Fatalf("succeeded, want %q", c.want)
			case !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), secret):
				t.Errorf("error %q: want %q in it and no token", err, c.want)
			}
			if strings.Contains(logs.String(), secret) {
				t.Errorf("logs hold the token:\n%s", logs.String())
			}
		})
	}
}

// lockedBuffer is a log sink safe for the watchdog's goroutine.
type lockedBuffer = testlog.Buffer
