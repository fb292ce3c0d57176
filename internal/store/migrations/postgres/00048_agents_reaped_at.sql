-- +goose Up
-- When a departed agent's commands were dealt with (the reaper), apart from when it was last
-- seen: the reaper used to mark it by setting last_seen to 0, which lost, for an operator, when
-- the agent went away.
ALTER TABLE agents ADD COLUMN reaped_at BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE agents DROP COLUMN reaped_at;
