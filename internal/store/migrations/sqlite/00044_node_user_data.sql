-- +goose Up
-- The operator user-data of a node's deploy: only the secret:// reference of the sealed value
-- (secrets), with its size and hex SHA-256 for display. '' / 0 when none is set; cleared (and
-- the secret deleted) when a new deploy replaces it or the node is released (ready, retired).
-- Written only by the deploy verb and the release: UpdateNode leaves these columns alone.
ALTER TABLE nodes ADD COLUMN user_data_ref TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN user_data_sha256 TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN user_data_size BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE nodes DROP COLUMN user_data_size;
ALTER TABLE nodes DROP COLUMN user_data_sha256;
ALTER TABLE nodes DROP COLUMN user_data_ref;
