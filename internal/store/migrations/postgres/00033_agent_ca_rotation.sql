-- +goose Up
-- Rotation of the agent CA (bcd ca rotate / activate / finish). Beside the active CA (cert_pem,
-- sealed_key) the row holds at most one other: the next CA, staged (trusted and handed out to
-- agents, not signing yet), or the previous one, the retired signer (trusted until the rotation
-- finishes; its key is not kept). version counts the changes: every server of the installation
-- reloads its CAs when it sees a new one.
ALTER TABLE installation_ca ADD COLUMN next_cert_pem TEXT NOT NULL DEFAULT '';
ALTER TABLE installation_ca ADD COLUMN next_sealed_key BYTEA;
ALTER TABLE installation_ca ADD COLUMN previous_cert_pem TEXT NOT NULL DEFAULT '';
ALTER TABLE installation_ca ADD COLUMN version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE installation_ca ADD COLUMN changed_at BIGINT NOT NULL DEFAULT 0;
-- What each agent (agents.id) said of its CAs at its last connection: the fingerprints of the CA
-- certificates it trusts (comma-separated) and of the CA that issued the certificate it
-- connected with, and that certificate's end (microseconds).
CREATE TABLE agent_ca_trust (
  agent_id TEXT PRIMARY KEY,
  trusted TEXT NOT NULL,
  cert_issuer TEXT NOT NULL,
  cert_not_after BIGINT NOT NULL,
  reported_at BIGINT NOT NULL
);

-- +goose Down
DROP TABLE agent_ca_trust;
ALTER TABLE installation_ca DROP COLUMN changed_at;
ALTER TABLE installation_ca DROP COLUMN version;
ALTER TABLE installation_ca DROP COLUMN previous_cert_pem;
ALTER TABLE installation_ca DROP COLUMN next_sealed_key;
ALTER TABLE installation_ca DROP COLUMN next_cert_pem;
