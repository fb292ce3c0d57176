package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Cancel is a command given up while an agent held it (Tx.UpdateCommand), which that agent is
// to be told to cancel: the agent, and what names the streams that may serve it (the command's
// node and site, and where it runs).
type Cancel struct {
	CommandID, AgentID     string
	NodeID, SiteID, RunsOn string
	// RequestedAt is when the command was given up (store microseconds).
	RequestedAt int64
}

const cancelCols = `id, target_agent, node_id, site_id, runs_on, cancel_requested_at`

func scanCancel(r interface{ Scan(...any) error }) (Cancel, error) {
	var c Cancel
	err := r.Scan(&c.CommandID, &c.AgentID, &c.NodeID, &c.SiteID, &c.RunsOn, &c.RequestedAt)
	return c, err
}

// MaxPendingCancels bounds the cancels one read returns (the oldest first): more than that
// waits for the next read, once the agents reported on the first.
const MaxPendingCancels = 4096

// PendingCancels lists the cancels agentID is still to be told, oldest first
// (commands_cancel_pending).
func (s *Store) PendingCancels(ctx context.Context, agentID string) ([]Cancel, error) {
	query, done := s.hotQuery() // (read at every agent's connection)
	defer done()
	rows, err := query(ctx, `SELECT `+cancelCols+` FROM commands WHERE target_agent = ? AND cancel_requested_at > 0
		ORDER BY cancel_requested_at, id LIMIT ?`, agentID, MaxPendingCancels)
	return collect(rows, err, "cancels of agent "+agentID, scanCancel)
}

// ServerCancels lists the cancels pending for the agents whose connection is server's, oldest
// first: one read for every agent the server serves (commands_cancel_pending holds only the
// pending ones).
func (s *Store) ServerCancels(ctx context.Context, server string) ([]Cancel, error) {
	rows, err := s.queryRows(ctx, `SELECT c.id, c.target_agent, c.node_id, c.site_id, c.runs_on, c.cancel_requested_at
		FROM commands c JOIN agents a ON a.id = c.target_agent
		WHERE c.cancel_requested_at > 0 AND a.server_id = ? AND a.connected = ?
		ORDER BY c.cancel_requested_at, c.id LIMIT ?`, server, true, MaxPendingCancels)
	return collect(rows, err, "cancels of server "+server+"'s agents", scanCancel)
}

// CancelReported ends the cancel of command id requested of agentID, if any: the agent
// reported the command's end.
func (t *Tx) CancelReported(ctx context.Context, id, agentID string) error {
	return t.execLater(ctx, "ending the cancel of command "+id, `UPDATE commands SET cancel_requested_at = 0
		WHERE id = ? AND target_agent = ? AND cancel_requested_at > 0`, id, agentID)
}

// ExpireCancels ends the cancels requested before before: past a command's own deadline its
// agent has ended it anyway.
func (t *Tx) ExpireCancels(ctx context.Context, before int64) error {
	return t.execLater(ctx, "ending old cancels", `UPDATE commands SET cancel_requested_at = 0
		WHERE cancel_requested_at > 0 AND cancel_requested_at < ?`, before)
}

// NodeAgentBoot records the key (keySHA256, the hex SHA-256 of its public key) node agent
// agentID connects with, after UpsertAgent recorded the connection, and reports whether the
// agent's last connection used another one: a ramdisk makes its key in RAM at every boot, so
// another key is another boot of the machine. An agent whose last key is unknown (its first
// connection) is not taken for another boot.
func (t *Tx) NodeAgentBoot(ctx context.Context, agentID, keySHA256 string) (bool, error) {
	var was string
	err := t.queryRow(ctx, `SELECT key_sha256 FROM agents WHERE id = ?`+t.forUpdate(), agentID).Scan(&was)
	if errors.Is(err, sql.ErrNoRows) {
		return false, fmt.Errorf("agent %s: %w", agentID, ErrNotFound)
	}
	if err != nil {
		return false, fmt.Errorf("reading the key agent %s last connected with: %w", agentID, err)
	}
	if was == keySHA256 {
		return false, nil
	}
	if err := t.execLater(ctx, "recording the key agent "+agentID+" connects with", `UPDATE agents SET key_sha256 = ? WHERE id = ?`, keySHA256, agentID); err != nil {
		return false, err
	}
	return was != "", nil
}

// LosePreviousBoot ends the commands a previous boot of node agent agentID acknowledged
// (delivered, running): lost, never sent again (that boot is gone, its journal with it, and
// the new one knows nothing of them), with why as their error. Its pending cancels end too:
// nothing runs them any more. The commands it was offered and never acknowledged stay queued
// for the new boot: they never ran. Returns the commands lost, as written.
func (t *Tx) LosePreviousBoot(ctx context.Context, agentID, why string) ([]Command, error) {
	lose, cancels := true, true
	if t.lc != nil {
		// On SQLite each update below first collects the rows it will change into a temporary
		// table (it changes a column of the index it reads them by): 16 and 7 µs even when no
		// row matches, as none do after a boot whose commands all finished. A read of both
		// conditions first (2.5 µs), and only the updates it calls for. (On PostgreSQL the read
		// would be a round trip more; the updates go out held.)
		if err := t.queryRow(ctx, `SELECT EXISTS (SELECT 1 FROM commands WHERE target_agent = ? AND `+agentActiveCond+` AND state <> 'queued'),
			EXISTS (SELECT 1 FROM commands WHERE target_agent = ? AND cancel_requested_at > 0)`, agentID, agentID).Scan(&lose, &cancels); err != nil {
			return nil, fmt.Errorf("looking for the commands of the previous boot of %s: %w", agentID, err)
		}
	}
	var lost []Command
	if lose {
		// The state condition names commands_agent_active's own (SQLite uses a partial index
		// only for a query that repeats its condition).
		rows, err := t.query(ctx, `UPDATE commands SET state = 'lost', error = ?, finished_at = ?, updated_at = ?
			WHERE target_agent = ? AND `+agentActiveCond+` AND state <> 'queued'
			RETURNING `+commandCols, why, t.at, t.at, agentID)
		if lost, err = collect(rows, err, "commands of the previous boot of "+agentID, scanCommand); err != nil {
			return nil, err
		}
	}
	if cancels {
		if err := t.execLater(ctx, "ending the cancels of the previous boot of "+agentID, `UPDATE commands SET cancel_requested_at = 0
			WHERE target_agent = ? AND cancel_requested_at > 0`, agentID); err != nil {
			return nil, err
		}
	}
	return lost, nil
}
