package store

import (
	"context"
	"fmt"
)

// WithdrawCommand fails a command no agent acknowledged yet (queued) with why. closed says it
// did; offered says an agent had claimed it, assigned to it (it may hold it, but it is never
// offered again, to it or to a later agent of the same id). A node agent's claim assigns
// nothing: a command only offered to it is closed here, and its acknowledgement refused. A command acknowledged or finished meanwhile is left
// alone. Each decision is one conditional update under the row's lock, so a concurrent claim or
// acknowledgement and the withdrawal never both win.
func (t *Tx) WithdrawCommand(ctx context.Context, id, why string) (closed, offered bool, err error) {
	for _, q := range []string{
		`UPDATE commands SET state = 'failed', error = ?, finished_at = ?, updated_at = ? WHERE id = ? AND state = 'queued' AND target_agent = ''`,
		`UPDATE commands SET state = 'failed', error = ?, finished_at = ?, updated_at = ? WHERE id = ? AND state = 'queued'`,
	} {
		res, err := t.exec(ctx, q, why, t.at, t.at, id)
		if err != nil {
			return false, false, fmt.Errorf("withdrawing command %s: %w", id, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return false, false, fmt.Errorf("withdrawing command %s: %w", id, err)
		}
		if n == 1 {
			return true, offered, nil
		}
		offered = true
	}
	return false, false, nil
}

// AgentConnected reports whether agent id has a connection now.
func (t *Tx) AgentConnected(ctx context.Context, id string) (bool, error) {
	var n int
	if err := t.queryRow(ctx, `SELECT COUNT(*) FROM agents WHERE id = ? AND connected = ?`, id, true).Scan(&n); err != nil {
		return false, fmt.Errorf("reading agent %s: %w", id, err)
	}
	return n > 0, nil
}

// WithdrawDirectCommands fails the node's held and queued commands that no workflow sent (an
// operator's power action waiting for its approval or an agent), except a BMC credential
// rotation (two-phase: it settles itself) and a console session (it runs beside workflows, and
// changes nothing by itself), and returns their ids and kinds: a workflow that takes the node
// must not have an operator's earlier action run in the middle of its steps.
func (t *Tx) WithdrawDirectCommands(ctx context.Context, nodeID, why string) ([][2]string, error) {
	scan := func(r interface{ Scan(...any) error }) ([2]string, error) {
		var c [2]string
		return c, r.Scan(&c[0], &c[1])
	}
	if t.s.engine != SQLite {
		// Claims on other connections may take a queued command meanwhile: one statement.
		rows, err := t.query(ctx, `UPDATE commands SET state = 'failed', error = ?, finished_at = ?, updated_at = ?
			WHERE `+directCommandsCond+` RETURNING id, kind`, why, t.at, t.at, nodeID)
		found, err := collect(rows, err, "direct commands", scan)
		if err != nil {
			return nil, fmt.Errorf("withdrawing the direct commands of node %s: %w", nodeID, err)
		}
		return found, nil
	}
	// SQLite's one writer: read (commands_node; usually nothing), then fail what was read. An
	// UPDATE … RETURNING builds temporary tables, at every workflow start.
	rows, err := t.query(ctx, directCommandsQuery, nodeID)
	found, err := collect(rows, err, "direct commands", scan)
	if err != nil || len(found) == 0 {
		if err != nil {
			err = fmt.Errorf("withdrawing the direct commands of node %s: %w", nodeID, err)
		}
		return nil, err
	}
	ids := make([]string, len(found))
	for i, c := range found {
		ids[i] = c[0]
	}
	for i := 0; i < len(ids); i += idsPerStatement {
		list, args := inList(ids[i:min(i+idsPerStatement, len(ids))])
		if _, err := t.exec(ctx, `UPDATE commands SET state = 'failed', error = ?, finished_at = ?, updated_at = ? WHERE id IN `+list,
			append([]any{why, t.at, t.at}, args...)...); err != nil {
			return nil, fmt.Errorf("withdrawing the direct commands of node %s: %w", nodeID, err)
		}
	}
	return found, nil
}

// directCommandsCond names a node's held and queued commands that no workflow sent, but
// rotations and consoles (WithdrawDirectCommands; argument: the node), found through
// commands_node; directCommandsQuery lists them.
const (
	directCommandsCond  = `node_id = ? AND workflow_id = '' AND state IN ('held', 'queued') AND kind NOT IN ('bmc.rotate', 'bmc.console')`
	directCommandsQuery = `SELECT id, kind FROM commands WHERE ` + directCommandsCond
)

// RequestWorkflowAbort marks the node's running workflow to be aborted (the abort verb): the
// reconciler then stops its step and runs its cleanup even if the node is back in the
// workflow's state by then (a recover right after the abort).
func (t *Tx) RequestWorkflowAbort(ctx context.Context, nodeID string) error {
	if _, err := t.exec(ctx, `UPDATE workflows SET abort_requested = ?, updated_at = ? WHERE node_id = ? AND NOT outcome_applied AND state = 'running'`,
		true, t.at, nodeID); err != nil {
		return fmt.Errorf("requesting the abort of node %s's workflow: %w", nodeID, err)
	}
	return nil
}

// QueuedConsoles lists the console commands no site agent took yet (their arguments name the
// server that holds the session).
func (t *Tx) QueuedConsoles(ctx context.Context) ([]Command, error) {
	rows, err := t.query(ctx, `SELECT `+commandCols+` FROM commands WHERE state = 'queued' AND runs_on = 'site' AND kind = 'bmc.console'`)
	if err != nil {
		return nil, fmt.Errorf("listing queued console commands: %w", err)
	}
	defer rows.Close()
	var out []Command
	for rows.Next() {
		c, err := scanCommand(rows)
		if err != nil {
			return nil, fmt.Errorf("listing queued console commands: %w", err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// OpenConsolesOf lists the node's console commands not ended (queued, delivered, running),
// oldest first: the sessions open on its console.
func (t *Tx) OpenConsolesOf(ctx context.Context, nodeID string) ([]Command, error) {
	rows, err := t.query(ctx, `SELECT `+commandCols+` FROM commands WHERE node_id = ? AND state IN ('queued', 'delivered', 'running') AND kind = 'bmc.console' ORDER BY created_at`, nodeID)
	return collect(rows, err, "open console commands of a node", scanCommand)
}
