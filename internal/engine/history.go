package engine

import (
	"context"
	"fmt"
	"time"

	"bcd/internal/store"
)

// History retention defaults (Config.HistoryRetention, Config.EventRetention).
const (
	DefaultHistoryRetention = 90 * 24 * time.Hour
	DefaultEventRetention   = 365 * 24 * time.Hour
	// MinRetention is the shortest retention accepted: history is what an operator reads
	// after an incident, and a mistyped unit must not delete it within minutes.
	MinRetention = 24 * time.Hour
)

// History is deleted in passes of one transaction each, so that the writer serves other work
// between them; one sweep runs at most historyPasses of them and leaves the rest to the next.
const (
	historyWorkflowsPerPass = 100  // with their commands: about 1 000 rows
	historyEventsPerPass    = 2000 // events are small rows with one index beside their key
	historyPasses           = 50
)

// checkRetention refuses a retention shorter than MinRetention (0: the default; negative: kept
// for ever).
func checkRetention(name string, d time.Duration) error {
	if d > 0 && d < MinRetention {
		return fmt.Errorf("%s %s: accepted is %s or more (0: the default; negative: keep for ever)", name, d, MinRetention)
	}
	return nil
}

// PurgeHistory deletes history older than the configured retentions (Config.HistoryRetention,
// Config.EventRetention): ended workflows with their finished commands (never a wipe's proof,
// nor a command a row in use names), finished commands of no workflow, events, and the batches (approval records) nothing names. It runs bounded passes until nothing is left
// or historyPasses ran, and returns what it deleted.
func (e *Engine) PurgeHistory(ctx context.Context) (store.Purged, error) {
	var total store.Purged
	if e.cfg.HistoryRetention < 0 && e.cfg.EventRetention < 0 {
		return total, nil
	}
	for range historyPasses {
		var p store.Purged
		err := e.st.Write(ctx, func(tx *store.Tx) error {
			var workflowsBefore, eventsBefore int64
			if e.cfg.HistoryRetention > 0 {
				workflowsBefore = tx.At() - e.cfg.HistoryRetention.Microseconds()
			}
			if e.cfg.EventRetention > 0 {
				eventsBefore = tx.At() - e.cfg.EventRetention.Microseconds()
			}
			var err error
			p, err = tx.PurgeHistory(ctx, workflowsBefore, historyWorkflowsPerPass, eventsBefore, historyEventsPerPass)
			return err
		})
		if err != nil {
			return total, err
		}
		total.Workflows += p.Workflows
		total.Commands += p.Commands
		total.Events += p.Events
		total.Batches += p.Batches
		total.Loose += p.Loose
		total.Plans += p.Plans
		if p.Workflows < historyWorkflowsPerPass && p.Loose < historyWorkflowsPerPass*store.LoosePerWorkflow && p.Events < historyEventsPerPass {
			break
		}
	}
	if total != (store.Purged{}) {
		e.log.Info("deleted history past its retention", "workflows", total.Workflows, "commands", total.Commands, "loose_commands", total.Loose, "events", total.Events, "batches", total.Batches, "plans", total.Plans,
			"history_retention", e.cfg.HistoryRetention, "event_retention", e.cfg.EventRetention)
	}
	return total, nil
}
