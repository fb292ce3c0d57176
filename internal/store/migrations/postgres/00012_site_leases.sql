-- +goose Up
-- The boot lease of each site (DESIGN §6): one holder, a fencing epoch bumped on every change of
-- hands, and the revision counter of the site's boot entries.
CREATE TABLE leases (
  site_id TEXT PRIMARY KEY,
  holder TEXT NOT NULL DEFAULT '',
  epoch BIGINT NOT NULL DEFAULT 0,
  expires_at BIGINT NOT NULL DEFAULT 0,
  acquired_at BIGINT NOT NULL DEFAULT 0,
  entries_rev BIGINT NOT NULL DEFAULT 0
);

-- Boot entries as the last succeeded boot.* command of each node left them, so that a new
-- lease holder can be given the whole table. Tokens are never stored: a push mints new ones.
CREATE TABLE boot_entries (
  site_id TEXT NOT NULL,
  node_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  macs TEXT NOT NULL DEFAULT '[]',
  local_boot TEXT NOT NULL DEFAULT '',
  generation BIGINT NOT NULL DEFAULT 0,
  command_id TEXT NOT NULL DEFAULT '',
  agent_id TEXT NOT NULL DEFAULT '',
  revision BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (site_id, node_id)
);
CREATE INDEX boot_entries_revision ON boot_entries (site_id, revision);

-- Power polling: consecutive failures of each node's BMC and whether BMC_UNREACHABLE is raised.
CREATE TABLE power_polls (
  node_id TEXT PRIMARY KEY,
  failures INTEGER NOT NULL DEFAULT 0,
  unreachable_since BIGINT NOT NULL DEFAULT 0,
  last_error TEXT NOT NULL DEFAULT '',
  last_ok_at BIGINT NOT NULL DEFAULT 0,
  updated_at BIGINT NOT NULL DEFAULT 0
);

-- +goose Down
DROP TABLE power_polls;
DROP TABLE boot_entries;
DROP TABLE leases;
