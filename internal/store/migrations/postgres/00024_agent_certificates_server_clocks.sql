-- +goose Up
-- When each agent's certificate is due for renewal and when it expires (microseconds; 0: not
-- known, a connection recorded before this migration or without a certificate). Set when the
-- agent connects and when it renews its certificate; doctor shows site agents' and flags a
-- renewal overdue.
ALTER TABLE agents ADD COLUMN cert_renew_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN cert_not_after BIGINT NOT NULL DEFAULT 0;
-- How far each server's clock was from the database's at its last heartbeat (microseconds, the
-- database's less the server's): servers keep the database's time (doctor shows the offset).
ALTER TABLE servers ADD COLUMN clock_offset BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE servers DROP COLUMN clock_offset;
ALTER TABLE agents DROP COLUMN cert_not_after;
ALTER TABLE agents DROP COLUMN cert_renew_at;
