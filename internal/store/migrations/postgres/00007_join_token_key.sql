-- +goose Up
ALTER TABLE join_tokens ADD COLUMN used_key BYTEA;

-- +goose Down
SELECT 1;
