-- +goose Up
ALTER TABLE join_tokens ADD COLUMN command_id TEXT NOT NULL DEFAULT '';

-- +goose Down
SELECT 1;
