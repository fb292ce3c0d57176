package store

import (
	"context"
	"fmt"
)

// Purged counts what one PurgeHistory call deleted.
type Purged struct {
	Workflows, Commands, Events, Batches int
	// Plans counts the workflow plans deleted: those no workflow names any more (purgePlans).
	Plans int
	// Loose counts, among Commands, those deleted as no workflow's (looseCommandsQuery).
	Loose int
}

// LoosePerWorkflow is how many loose commands one PurgeHistory call deletes per workflow of its
// limit: about as many rows as the workflows' own commands.
const LoosePerWorkflow = 10

// historyDeletableCommand is the condition a finished command is deleted under: it is no proof (an
// attested result with its signature, a wipe's: kept for as long as the store lives, as the
// retired agent CAs that verify them are) and no row still in use names it (a boot entry, a
// join token, a BMC credential version, a lingering ramdisk's power-off).
const historyDeletableCommand = `state IN ('succeeded', 'failed', 'lost')
	AND NOT (attested AND result_sig IS NOT NULL)
	AND id NOT IN (SELECT command_id FROM boot_entries WHERE command_id <> '')
	AND id NOT IN (SELECT command_id FROM join_tokens WHERE command_id <> '')
	AND id NOT IN (SELECT command_id FROM bmc_credential_versions WHERE command_id <> '')
	AND id NOT IN (SELECT linger_command FROM nodes WHERE linger_command <> '')`

// endedBatchesQuery lists, oldest first (batches_state), batches decided before a time that
// nothing names any more: no node parked on them, no workflow or command of theirs left.
const endedBatchesQuery = `SELECT id FROM batches WHERE state IN ('running', 'rejected', 'cancelled') AND created_at < ?
	AND NOT EXISTS (SELECT 1 FROM nodes WHERE nodes.batch_id = batches.id)
	AND NOT EXISTS (SELECT 1 FROM workflows WHERE workflows.batch_id = batches.id)
	AND NOT EXISTS (SELECT 1 FROM commands WHERE commands.batch_id = batches.id)
	ORDER BY state, created_at LIMIT ?`

// looseCommandsQuery lists, oldest first (commands_loose), the deletable commands that finished
// before a time and belong to no workflow: those run without one (a credential rotation, an
// operator's power command) and those an ended workflow left behind when it was deleted because a
// row still named them then (PurgeHistory makes them loose). Those a row still names, and a
// loose proof, are read and kept at each pass: a few per node. SQLite without statistics would
// rather search commands_node and sort every loose command: it is told.
func looseCommandsQuery(e Engine) string {
	from := "commands"
	if e == SQLite {
		from += " INDEXED BY commands_loose"
	}
	return `SELECT id FROM ` + from + ` WHERE workflow_id = '' AND finished_at > 0 AND finished_at < ? AND ` + historyDeletableCommand + `
	ORDER BY finished_at LIMIT ?`
}

// endedWorkflowsQuery lists, oldest first, workflows that ended before a time (workflows_ended)
// and hold no command still unfinished (a workflow's commands are found by its node and its id,
// commands_node).
const endedWorkflowsQuery = `SELECT id FROM workflows WHERE outcome_applied AND finished_at > 0 AND finished_at < ?
	AND NOT EXISTS (SELECT 1 FROM commands c WHERE c.node_id = workflows.node_id AND c.workflow_id = workflows.id
		AND c.state NOT IN ('succeeded', 'failed', 'lost'))
	ORDER BY finished_at LIMIT ?`

// ofWorkflows is the condition on commands that names those of the workflows in an IN list, by
// node and workflow (commands_node: an IN list of workflow ids alone would scan the table).
func ofWorkflows(list string) string {
	return `(node_id, workflow_id) IN (SELECT node_id, id FROM workflows WHERE id IN ` + list + `)`
}

// purgePlansQuery deletes the workflow plans used before a time (workflow_plans_used) that no
// workflow names (workflows_plan: the condition that plan is not empty, always true of a
// digest, lets the search use that partial index).
const purgePlansQuery = `DELETE FROM workflow_plans WHERE used_at < ?
	AND NOT EXISTS (SELECT 1 FROM workflows WHERE workflows.plan = workflow_plans.digest AND workflows.plan <> '')`

// purgePlans deletes the workflow plans that no workflow names and no workflow began on since
// before, nor in the last two planTouchEvery. A workflow that begins on a plan moves the
// plan's used_at on once it is older than planTouchEvery (touchPlanQuery), so that on
// PostgreSQL a purge that read the plan as unused before that workflow committed finds it used
// when it comes to delete it.
func (t *Tx) purgePlans(ctx context.Context, before int64) (int, error) {
	res, err := t.exec(ctx, purgePlansQuery, min(before, t.at-2*planTouchEvery))
	if err != nil {
		return 0, fmt.Errorf("purging the plans of ended workflows: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// PurgeHistory deletes history older than the retention: up to limit workflows that ended
// before workflowsBefore, with their finished commands (see historyDeletableCommand) and the
// plans no workflow names any more (purgePlans), up to
// limit×LoosePerWorkflow loose commands that finished before it (looseCommandsQuery), and up to
// eventLimit events recorded before eventsBefore (0: none), and as many batches created before
// it that nothing names any more (endedBatchesQuery), with their leaves and approvals: the
// record of who approved destructive work lives as long as the events that tell of it. A workflow with a command not yet
// finished is left (never the case past a command's deadline; a report for it would find its
// workflow gone); its finished commands that are kept (proofs, rows in use) stay without it.
// Each call is a bounded piece of work for one transaction: the caller repeats it while it
// deletes a full batch.
func (t *Tx) PurgeHistory(ctx context.Context, workflowsBefore int64, limit int, eventsBefore int64, eventLimit int) (Purged, error) {
	var p Purged
	if workflowsBefore > 0 && limit > 0 {
		rows, err := t.query(ctx, endedWorkflowsQuery, workflowsBefore, limit)
		ids, err := collect(rows, err, "ended workflows", scanID)
		if err != nil {
			return p, fmt.Errorf("purging history: %w", err)
		}
		for i := 0; i < len(ids); i += idsPerStatement {
			list, args := inList(ids[i:min(i+idsPerStatement, len(ids))])
			res, err := t.exec(ctx, `DELETE FROM commands WHERE `+ofWorkflows(list)+` AND `+historyDeletableCommand, args...)
			if err != nil {
				return p, fmt.Errorf("purging the commands of ended workflows: %w", err)
			}
			n, _ := res.RowsAffected()
			p.Commands += int(n)
			// What a row still names stays, loose: once nothing names it, the loose pass
			// takes it. A proof keeps its workflow's id, for whoever reads it. (Before the
			// workflows go: their rows name their commands' node.)
			if _, err := t.exec(ctx, `UPDATE commands SET workflow_id = '' WHERE `+ofWorkflows(list)+` AND NOT (attested AND result_sig IS NOT NULL)`, args...); err != nil {
				return p, fmt.Errorf("loosening the kept commands of ended workflows: %w", err)
			}
			if res, err = t.exec(ctx, `DELETE FROM workflows WHERE id IN `+list, args...); err != nil {
				return p, fmt.Errorf("purging ended workflows: %w", err)
			}
			n, _ = res.RowsAffected()
			p.Workflows += int(n)
		}
		if p.Plans, err = t.purgePlans(ctx, workflowsBefore); err != nil {
			return p, err
		}
		rows, err = t.query(ctx, looseCommandsQuery(t.s.engine), workflowsBefore, limit*LoosePerWorkflow)
		ids, err = collect(rows, err, "loose commands", scanID)
		if err != nil {
			return p, fmt.Errorf("purging history: %w", err)
		}
		for i := 0; i < len(ids); i += idsPerStatement {
			list, args := inList(ids[i:min(i+idsPerStatement, len(ids))])
			res, err := t.exec(ctx, `DELETE FROM commands WHERE id IN `+list, args...)
			if err != nil {
				return p, fmt.Errorf("purging loose commands: %w", err)
			}
			n, _ := res.RowsAffected()
			p.Commands += int(n)
			p.Loose += int(n)
		}
	}
	if eventsBefore > 0 && eventLimit > 0 {
		// By id, oldest first: the scan stops after eventLimit (ids follow time closely enough
		// that an event recorded a little out of order is taken at the next pass).
		res, err := t.exec(ctx, `DELETE FROM events WHERE id IN (SELECT id FROM events WHERE at < ? ORDER BY id LIMIT ?)`, eventsBefore, eventLimit)
		if err != nil {
			return p, fmt.Errorf("purging events: %w", err)
		}
		n, _ := res.RowsAffected()
		p.Events = int(n)
		rows, err := t.query(ctx, endedBatchesQuery, eventsBefore, eventLimit)
		ids, err := collect(rows, err, "ended batches", scanID)
		if err != nil {
			return p, fmt.Errorf("purging history: %w", err)
		}
		for i := 0; i < len(ids); i += idsPerStatement {
			list, args := inList(ids[i:min(i+idsPerStatement, len(ids))])
			for _, table := range []string{"batch_leaves", "approvals"} {
				if _, err := t.exec(ctx, `DELETE FROM `+table+` WHERE batch_id IN `+list, args...); err != nil {
					return p, fmt.Errorf("purging the %s of ended batches: %w", table, err)
				}
			}
			res, err := t.exec(ctx, `DELETE FROM batches WHERE id IN `+list, args...)
			if err != nil {
				return p, fmt.Errorf("purging ended batches: %w", err)
			}
			n, _ := res.RowsAffected()
			p.Batches += int(n)
		}
	}
	return p, nil
}
