package tftp

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// lines counts the log records of each message.
type lines struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n[r.Message]++
	return nil
}
func (l *lines) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *lines) WithGroup(string) slog.Handler      { return l }
func (l *lines) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[msg]
}

// TestRefusedNamesDoNotFloodTheLog: read requests for names no route serves, or names refused
// as malformed, are answered each, but logged at most once every refusalWarnEvery: a client (or
// anyone on the provisioning network) asking in a loop cannot fill the site agent's log.
func TestRefusedNamesDoNotFloodTheLog(t *testing.T) {
	got := &lines{n: map[string]int{}}
	client := serveLoopback(t, Config{Routes: []Route{fakeRoute{}}, Logger: slog.New(got)})
	const each = 40
	start := time.Now()
	for i := range each {
		for _, name := range []string{"missing-" + strings.Repeat("x", i%5) + ".efi", "../secret"} {
			if _, err := client.Receive(name, "octet"); err == nil {
				t.Fatalf("%q not refused", name)
			}
		}
	}
	// One line, and one more for each spacing the requests took (a loaded machine).
	most := 1 + int(time.Since(start)/refusalWarnEvery)
	if n := got.count("tftp file not found"); n < 1 || n > most {
		t.Errorf("%d requests for missing names logged %d lines, want 1 to %d", each, n, most)
	}
	if n := got.count("tftp requested name refused"); n < 1 || n > most {
		t.Errorf("%d malformed names logged %d lines, want 1 to %d", each, n, most)
	}
}
