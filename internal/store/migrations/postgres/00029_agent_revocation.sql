-- +goose Up
-- When an operator revoked a site agent's certificate (microseconds; 0: not revoked): the
-- gateway refuses it from then on (bcd site revoke-agent).
ALTER TABLE agents ADD COLUMN revoked_at BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE agents DROP COLUMN revoked_at;
