-- +goose Up
CREATE TABLE tenants (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  created_at BIGINT NOT NULL
);
CREATE TABLE sites (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  name TEXT NOT NULL UNIQUE,
  labels TEXT NOT NULL DEFAULT '{}',
  created_at BIGINT NOT NULL
);
CREATE TABLE hardware_profiles (
  name TEXT PRIMARY KEY,
  drivers TEXT NOT NULL,
  local_boot TEXT NOT NULL DEFAULT 'exit',
  updated_at BIGINT NOT NULL
);
CREATE TABLE pools (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  site_id TEXT NOT NULL REFERENCES sites(id),
  name TEXT NOT NULL UNIQUE,
  policy TEXT NOT NULL,
  created_at BIGINT NOT NULL
);
CREATE TABLE secrets (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL,
  sealed BLOB NOT NULL,
  created_at BIGINT NOT NULL
);
CREATE TABLE nodes (
  id TEXT PRIMARY KEY,
  tenant_id TEXT NOT NULL REFERENCES tenants(id),
  site_id TEXT NOT NULL REFERENCES sites(id),
  pool_id TEXT NOT NULL REFERENCES pools(id),
  name TEXT NOT NULL,
  state TEXT NOT NULL,
  target_state TEXT NOT NULL DEFAULT '',
  chain_verb TEXT NOT NULL DEFAULT '',
  failed_from TEXT NOT NULL DEFAULT '',
  fault_code TEXT NOT NULL DEFAULT '',
  fault_message TEXT NOT NULL DEFAULT '',
  maintenance INTEGER NOT NULL DEFAULT 0,
  maintenance_reason TEXT NOT NULL DEFAULT '',
  power TEXT NOT NULL DEFAULT 'unknown',
  hardware_profile TEXT NOT NULL,
  drivers TEXT NOT NULL DEFAULT '{}',
  bmc_driver TEXT NOT NULL,
  bmc_address TEXT NOT NULL,
  bmc_username_ref TEXT NOT NULL,
  bmc_password_ref TEXT NOT NULL,
  bmc_insecure INTEGER NOT NULL DEFAULT 0,
  bmc_fingerprint TEXT NOT NULL DEFAULT '',
  product_uuid TEXT NOT NULL DEFAULT '',
  labels TEXT NOT NULL DEFAULT '{}',
  macs TEXT NOT NULL DEFAULT '[]',
  deploy_profile TEXT NOT NULL DEFAULT '',
  deploy_image TEXT NOT NULL DEFAULT '',
  wipe_mode TEXT NOT NULL DEFAULT '',
  batch_id TEXT NOT NULL DEFAULT '',
  identity_generation BIGINT NOT NULL DEFAULT 1,
  version BIGINT NOT NULL DEFAULT 1,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  UNIQUE (tenant_id, name)
);
CREATE INDEX nodes_state ON nodes (state, id);
CREATE INDEX nodes_pool ON nodes (pool_id, id);
CREATE INDEX nodes_site ON nodes (site_id, id);
CREATE TABLE node_macs (
  mac TEXT PRIMARY KEY,
  node_id TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE
);
CREATE INDEX node_macs_node ON node_macs (node_id);
CREATE TABLE node_labels (
  node_id TEXT NOT NULL REFERENCES nodes(id) ON DELETE CASCADE,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY (node_id, key)
);
CREATE INDEX node_labels_kv ON node_labels (key, value, node_id);
CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  at BIGINT NOT NULL,
  tenant_id TEXT NOT NULL,
  node_id TEXT NOT NULL DEFAULT '',
  actor TEXT NOT NULL,
  kind TEXT NOT NULL,
  from_state TEXT NOT NULL DEFAULT '',
  to_state TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX events_node ON events (node_id, id);
CREATE TABLE reconcile_queue (
  node_id TEXT PRIMARY KEY,
  due_at BIGINT NOT NULL,
  reason TEXT NOT NULL,
  enqueued_at BIGINT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX reconcile_queue_due ON reconcile_queue (due_at);
CREATE TABLE commands (
  id TEXT PRIMARY KEY,
  node_id TEXT NOT NULL,
  tenant_id TEXT NOT NULL,
  site_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  subject TEXT NOT NULL,
  state TEXT NOT NULL,
  args TEXT NOT NULL DEFAULT '{}',
  target_agent TEXT NOT NULL DEFAULT '',
  attempts INTEGER NOT NULL DEFAULT 0,
  result TEXT NOT NULL DEFAULT '',
  error TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL
);
CREATE INDEX commands_node ON commands (node_id, created_at);
CREATE INDEX commands_state ON commands (state, site_id);
CREATE TABLE api_tokens (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  hash BLOB NOT NULL UNIQUE,
  role TEXT NOT NULL,
  tenant_id TEXT NOT NULL DEFAULT '',
  created_by TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  revoked_at BIGINT NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE api_tokens;
DROP TABLE commands;
DROP TABLE reconcile_queue;
DROP TABLE events;
DROP TABLE node_labels;
DROP TABLE node_macs;
DROP TABLE nodes;
DROP TABLE secrets;
DROP TABLE pools;
DROP TABLE hardware_profiles;
DROP TABLE sites;
DROP TABLE tenants;
