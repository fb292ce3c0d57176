package cli

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"bcd/internal/gen/bcdv1"
)

// TestPrintCommands: oldest first, each with how long it waited for an agent and ran, its step
// as profile#index ("-" for an operator's), "-" where a time or agent is missing.
func TestPrintCommands(t *testing.T) {
	var b bytes.Buffer
	err := printCommands(&b, []*bcdv1.CommandRecord{ // newest first, as the API answers
		{Kind: "bmc.power", State: "queued", CreatedAt: "2026-12-07T03:00:09Z"},
		{Kind: "bmc.power", State: "lost", Agent: "site-1", Attempts: 1, Workflow: "01a2-wf", Profile: "default", Step: 5,
			CreatedAt: "2026-12-07T03:00:02Z", DeliveredAt: "2026-12-07T03:00:02.25Z", Error: "agent site-1 went away after acknowledging the command; it is never sent twice"},
		{Kind: "disk.wipe", State: "succeeded", Agent: "node:n1", Attempts: 1, Workflow: "01a2-wf0", Profile: "metal-commission", Step: 13,
			CreatedAt: "2026-12-07T02:58:00Z", DeliveredAt: "2026-12-07T02:58:01.5Z", FinishedAt: "2026-12-07T03:00:01Z"},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines: %q", len(lines), b.String())
	}
	for i, want := range [][]string{
		{"QUEUED", "KIND", "STATE", "AGENT", "WAITED", "RAN", "TRIES", "STEP", "ERROR"},
		{"2026-12-07T02:58:00Z", "disk.wipe", "succeeded", "node:n1", "1.5s", "2m0s", "1", "metal-commission#13", "-"},
		{"2026-12-07T03:00:02Z", "bmc.power", "lost", "site-1", "250ms", "-", "1", "default#5", "agent site-1 went away"},
		{"2026-12-07T03:00:09Z", "bmc.power", "queued", "-", "-", "-", "0", "-", "-"},
	} {
		f := strings.Fields(lines[i])
		if len(f) < len(want) || !slices.Equal(f[:len(want)-1], want[:len(want)-1]) || !strings.Contains(lines[i], want[len(want)-1]) {
			t.Errorf("line %d: %q, want %v", i, lines[i], want)
		}
	}
}
