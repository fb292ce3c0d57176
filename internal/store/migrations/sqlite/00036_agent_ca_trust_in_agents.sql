-- +goose Up
-- What an agent said of its CAs at its last connection moves into its row (it was
-- agent_ca_trust, 00033), written by the connection's own write: the fingerprints of the CA
-- certificates it trusts (comma-separated), of the CA that issued the certificate it connected
-- with, and when it said so (0: that connection said nothing). The certificate's end is
-- cert_not_after.
ALTER TABLE agents ADD COLUMN trusted_cas TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN issuer_ca TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN ca_reported_at BIGINT NOT NULL DEFAULT 0;
UPDATE agents SET
  trusted_cas = (SELECT t.trusted FROM agent_ca_trust t WHERE t.agent_id = agents.id),
  issuer_ca = (SELECT t.cert_issuer FROM agent_ca_trust t WHERE t.agent_id = agents.id),
  ca_reported_at = (SELECT t.reported_at FROM agent_ca_trust t WHERE t.agent_id = agents.id)
  WHERE id IN (SELECT agent_id FROM agent_ca_trust);
DROP TABLE agent_ca_trust;

-- +goose Down
CREATE TABLE agent_ca_trust (
  agent_id TEXT PRIMARY KEY,
  trusted TEXT NOT NULL,
  cert_issuer TEXT NOT NULL,
  cert_not_after BIGINT NOT NULL,
  reported_at BIGINT NOT NULL
);
INSERT INTO agent_ca_trust (agent_id, trusted, cert_issuer, cert_not_after, reported_at)
  SELECT id, trusted_cas, issuer_ca, cert_not_after, ca_reported_at FROM agents WHERE ca_reported_at > 0;
ALTER TABLE agents DROP COLUMN ca_reported_at;
ALTER TABLE agents DROP COLUMN issuer_ca;
ALTER TABLE agents DROP COLUMN trusted_cas;
