package engine

import (
	"errors"
	"fmt"
	"testing"

	"bcd/internal/store"
)

// reported over every stored state and every reported state, by the assigned agent and by
// another: the command never moves backwards, a final command never changes, progress is kept
// only for a running command, and another agent's report is refused.
func TestReportedExhaustive(t *testing.T) {
	states := []string{"held", "queued", "delivered", "running", "succeeded", "failed", "lost"}
	reports := []string{"running", "succeeded", "failed"}
	rank := map[string]int{"held": 0, "queued": 1, "delivered": 2, "running": 3, "succeeded": 4, "failed": 4, "lost": 4}
	const at = 1000
	for _, from := range states {
		for _, to := range reports {
			for _, progress := range []bool{false, true} {
				for _, agent := range []string{"a", "b"} {
					name := fmt.Sprintf("%s→%s/progress=%v/by=%s", from, to, progress, agent)
					c := store.Command{ID: "c1", State: from, TargetAgent: "a", DeliveredAt: 0}
					u := Update{CommandID: "c1", State: to, Result: []byte(`{"ok":true}`), NodeSig: []byte{1}, SignerCertDER: []byte{2}}
					if progress {
						u.ProgressDone, u.ProgressTotal = 1, 2
					}
					next, write, err := reported(c, Agent{ID: agent}, u, at)
					if agent != "a" {
						if !errors.Is(err, ErrNotYours) || write {
							t.Errorf("%s: write %v, error %v (want ErrNotYours)", name, write, err)
						}
						continue
					}
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					forward := from != "held" && rank[to] > rank[from]
					sameRunning := from == "running" && to == "running" && progress
					switch {
					case forward:
						if !write || next.State != to || next.DeliveredAt != at {
							t.Errorf("%s: write %v state %s delivered %d", name, write, next.State, next.DeliveredAt)
						}
						final := to != "running"
						if final != (next.FinishedAt == at && string(next.Result) == `{"ok":true}` && len(next.ResultSig) == 1) {
							t.Errorf("%s: outcome recorded %v, want %v", name, !final, final)
						}
					case sameRunning:
						if !write || next.State != "running" || next.Progress == "" {
							t.Errorf("%s: progress of a running command: write %v progress %q", name, write, next.Progress)
						}
					default:
						if write {
							t.Errorf("%s: wrote %+v, want the report ignored", name, next)
						}
					}
				}
			}
		}
	}
}
