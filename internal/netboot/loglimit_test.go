package netboot

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A host posting bad discovery reports in a loop gets one warning a minute in the agent's log,
// which then says how many it held back; another host gets its own.
func TestRefusedDiscoveryReportsLoggedOncePerMinute(t *testing.T) {
	h, _ := newTestHandler(t, fakeEntries{}, fakeArtifacts{})
	var logged bytes.Buffer
	h.log = slog.New(slog.NewJSONHandler(&logged, nil))
	now := time.Unix(5000, 0)
	h.now = func() time.Time { return now }
	post := func(remote string) {
		req := httptest.NewRequest("POST", DiscoveryPath, strings.NewReader(`not json`))
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest {
			t.Fatalf("a bad report: %d", rec.Code)
		}
	}
	lines := func() []map[string]any { return logLines(t, &logged, "discovery report refused") }
	for range 100 {
		post("10.0.0.9:1234")
	}
	post("10.0.0.10:999")
	if got := lines(); len(got) != 2 {
		t.Fatalf("%d warnings for 101 bad reports from two hosts, want 2", len(got))
	}
	now = now.Add(time.Minute)
	post("10.0.0.9:1235")
	got := lines()
	if len(got) != 3 || got[2]["held_back"] != float64(99) {
		t.Fatalf("after a minute: %v, want a third warning holding back 99", got)
	}
}

// logLines are the JSON log lines in logged whose message is msg.
func logLines(t *testing.T, logged *bytes.Buffer, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logged.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}
