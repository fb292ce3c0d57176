-- +goose Up
ALTER TABLE agents ADD COLUMN conn_id TEXT NOT NULL DEFAULT '';

-- +goose Down
SELECT 1;
