-- +goose Up
CREATE TABLE approval_policies (
  scope TEXT PRIMARY KEY,
  required INTEGER NOT NULL,
  updated_by TEXT NOT NULL DEFAULT '',
  updated_at BIGINT NOT NULL
);
CREATE TABLE batches (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL,
  site_id TEXT NOT NULL DEFAULT '',
  pool_id TEXT NOT NULL DEFAULT '',
  kind TEXT NOT NULL,
  verb TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  requested_by TEXT NOT NULL,
  state TEXT NOT NULL,
  required INTEGER NOT NULL DEFAULT 0,
  size INTEGER NOT NULL DEFAULT 0,
  leaves INTEGER NOT NULL DEFAULT 0,
  decided_by TEXT NOT NULL DEFAULT '',
  decision_reason TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  decided_at BIGINT NOT NULL DEFAULT 0,
  started_at BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX batches_state ON batches (state, created_at);
CREATE TABLE batch_leaves (
  batch_id TEXT NOT NULL,
  subject TEXT NOT NULL,
  kind TEXT NOT NULL,
  PRIMARY KEY (batch_id, subject, kind)
);
CREATE TABLE approvals (
  batch_id TEXT NOT NULL,
  approver TEXT NOT NULL,
  at BIGINT NOT NULL,
  PRIMARY KEY (batch_id, approver)
);
CREATE TABLE bmc_credential_versions (
  id TEXT PRIMARY KEY,
  node_id TEXT NOT NULL,
  version BIGINT NOT NULL,
  username_ref TEXT NOT NULL,
  password_ref TEXT NOT NULL,
  state TEXT NOT NULL,
  command_id TEXT NOT NULL DEFAULT '',
  error TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  decided_at BIGINT NOT NULL DEFAULT 0,
  UNIQUE (node_id, version)
);
CREATE INDEX bmc_credential_versions_command ON bmc_credential_versions (command_id);
ALTER TABLE workflows ADD COLUMN batch_id TEXT NOT NULL DEFAULT '';
ALTER TABLE commands ADD COLUMN batch_id TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN verb_from TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN verb_by TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN conditions TEXT NOT NULL DEFAULT '{}';
CREATE INDEX nodes_batch ON nodes (batch_id, id);
CREATE INDEX workflows_batch ON workflows (batch_id);
CREATE INDEX commands_batch ON commands (batch_id, state);

-- +goose Down
DROP INDEX commands_batch;
DROP INDEX workflows_batch;
DROP INDEX nodes_batch;
DROP TABLE bmc_credential_versions;
DROP TABLE approvals;
DROP TABLE batch_leaves;
DROP TABLE batches;
DROP TABLE approval_policies;
