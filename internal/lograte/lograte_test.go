package lograte

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// One line per key and interval; the next one let through says how many were held back; keys
// are independent; a full table is emptied; a clock that went back lets a line through.
func TestAllow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := New(time.Minute, 2)
	for _, tc := range []struct {
		key  string
		at   time.Duration
		ok   bool
		held int
	}{
		{"a", 0, true, 0},
		{"a", time.Second, false, 0},
		{"a", 59 * time.Second, false, 0},
		{"b", 59 * time.Second, true, 0},
		{"a", time.Minute, true, 2},
		{"a", time.Minute + time.Second, false, 0},
		{"a", 30 * time.Second, true, 1}, // the clock went back
		{"c", 2 * time.Minute, true, 0},  // a third key: the table is emptied first
		{"a", 2 * time.Minute, true, 0},  // forgotten: let through, its held count lost
	} {
		ok, held := l.Allow(tc.key, t0.Add(tc.at))
		if ok != tc.ok || held != tc.held {
			t.Errorf("%s at %s: %v %d, want %v %d", tc.key, tc.at, ok, held, tc.ok, tc.held)
		}
	}
}

func TestLog(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&out, nil))
	l := New(time.Minute, 8)
	t0 := time.Unix(1000, 0)
	for i := range 10 {
		l.Log(context.Background(), log, slog.LevelWarn, t0.Add(time.Duration(i)*time.Second), "k", "flood", "n", i)
	}
	l.Log(context.Background(), log, slog.LevelWarn, t0.Add(time.Minute), "k", "flood", "n", 10)
	var held []float64
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		held = append(held, m[HeldBack].(float64))
	}
	if len(held) != 2 || held[0] != 0 || held[1] != 9 {
		t.Fatalf("lines' %s: %v, want [0 9]", HeldBack, held)
	}
}
