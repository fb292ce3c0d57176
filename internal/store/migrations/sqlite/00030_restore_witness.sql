-- +goose Up
-- An agent that connects having seen a newer watermark of this store than the store has shows
-- that the store was restored from an older backup with no fence run (a restore onto a new
-- host, where no server kept a watermark): what it showed (JSON: the agent, the watermark it
-- saw, when), empty while no agent did. While set the servers send no command; the restore
-- fence (bcd store after-restore) clears it.
ALTER TABLE control_plane ADD COLUMN restore_witness TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE control_plane DROP COLUMN restore_witness;
