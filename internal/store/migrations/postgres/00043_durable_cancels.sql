-- +goose Up
-- A command the control plane gives up while an agent holds it (an aborted workflow, a step out
-- of time) is to be cancelled on that agent: when it was given up, set by the write that gave it
-- up (Tx.UpdateCommand), 0 once the agent reported the command's end or a day has passed. Kept
-- in the row, not in the server that gave it up, so that the server holding the agent's
-- connection tells the agent (Store.PendingCancels, Store.ServerCancels). Only the pending
-- ones are in the index: a few rows, never the history.
ALTER TABLE commands ADD COLUMN cancel_requested_at BIGINT NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS commands_cancel_pending ON commands (target_agent, cancel_requested_at) WHERE cancel_requested_at > 0;
-- The SHA-256 of the public key a node agent last connected with (hex; '' unknown): a ramdisk
-- makes its key in RAM at every boot, so another key is another boot of the machine, and the
-- commands the previous boot acknowledged can no longer finish (Tx.NodeAgentBoot).
ALTER TABLE agents ADD COLUMN key_sha256 TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE agents DROP COLUMN key_sha256;
DROP INDEX IF EXISTS commands_cancel_pending;
ALTER TABLE commands DROP COLUMN cancel_requested_at;
