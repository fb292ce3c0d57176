-- +goose Up
-- When each agent's certificate is due for renewal and when it expires (microseconds; 0: not
-- known, a connection recorded before this migration or without a certificate). Set when the
-- agent connects and when it renews its certificate; doctor shows site agents' and flags a
-- renewal overdue.
ALTER TABLE agents ADD COLUMN cert_renew_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE agents ADD COLUMN cert_not_after BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE agents DROP COLUMN cert_not_after;
ALTER TABLE agents DROP COLUMN cert_renew_at;
