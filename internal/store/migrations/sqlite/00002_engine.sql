-- +goose Up
ALTER TABLE reconcile_queue ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE reconcile_queue ADD COLUMN leased_by TEXT NOT NULL DEFAULT '';
ALTER TABLE reconcile_queue ADD COLUMN leased_until BIGINT NOT NULL DEFAULT 0;
CREATE TABLE workflows (
  id TEXT PRIMARY KEY,
  node_id TEXT NOT NULL,
  tenant_id TEXT NOT NULL,
  profile TEXT NOT NULL,
  owner TEXT NOT NULL,
  node_state TEXT NOT NULL,
  steps TEXT NOT NULL,
  cleanup TEXT NOT NULL,
  command_kinds TEXT NOT NULL,
  state TEXT NOT NULL,
  phase TEXT NOT NULL,
  step_index INTEGER NOT NULL DEFAULT 0,
  step_attempt INTEGER NOT NULL DEFAULT 0,
  step_started_at BIGINT NOT NULL DEFAULT 0,
  step_deadline BIGINT NOT NULL DEFAULT 0,
  current_command TEXT NOT NULL DEFAULT '',
  boot_epoch BIGINT NOT NULL DEFAULT 0,
  abort_requested INTEGER NOT NULL DEFAULT 0,
  fault_code TEXT NOT NULL DEFAULT '',
  error TEXT NOT NULL DEFAULT '',
  outcome_applied INTEGER NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  finished_at BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX workflows_node ON workflows (node_id, created_at);
CREATE INDEX workflows_open ON workflows (state, node_id);
ALTER TABLE commands ADD COLUMN workflow_id TEXT NOT NULL DEFAULT '';
ALTER TABLE commands ADD COLUMN step_index INTEGER NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN runs_on TEXT NOT NULL DEFAULT 'site';
ALTER TABLE commands ADD COLUMN destructive INTEGER NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN attested INTEGER NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN reroutable INTEGER NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN deadline BIGINT NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN delivered_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN finished_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE commands ADD COLUMN progress TEXT NOT NULL DEFAULT '';
ALTER TABLE commands ADD COLUMN result_sig BLOB;
ALTER TABLE commands ADD COLUMN signer_cert BLOB;
CREATE INDEX commands_claim ON commands (runs_on, site_id, state, target_agent);
CREATE INDEX commands_workflow ON commands (workflow_id);
CREATE TABLE agents (
  id TEXT PRIMARY KEY,
  kind TEXT NOT NULL,
  site_id TEXT NOT NULL DEFAULT '',
  node_id TEXT NOT NULL DEFAULT '',
  generation BIGINT NOT NULL DEFAULT 0,
  connected INTEGER NOT NULL DEFAULT 0,
  connected_at BIGINT NOT NULL DEFAULT 0,
  last_seen BIGINT NOT NULL DEFAULT 0,
  version TEXT NOT NULL DEFAULT ''
);
CREATE INDEX agents_site ON agents (site_id, connected);
CREATE INDEX agents_node ON agents (node_id);
CREATE TABLE node_inventory (
  node_id TEXT PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
  inventory TEXT NOT NULL,
  updated_at BIGINT NOT NULL
);

-- +goose Down
DROP TABLE node_inventory;
DROP TABLE agents;
DROP TABLE workflows;
