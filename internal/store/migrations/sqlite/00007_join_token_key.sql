-- +goose Up
ALTER TABLE join_tokens ADD COLUMN used_key BLOB;

-- +goose Down
SELECT 1;
