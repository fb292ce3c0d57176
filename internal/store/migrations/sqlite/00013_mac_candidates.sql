-- +goose Up
-- A MAC-less node's candidate MAC, learned from what it PXE-booted with after the power cycle
-- of its workflow (DESIGN §6 Discovery): pending until an operator confirms it, or bound at once
-- on a trusted provisioning network.
CREATE TABLE mac_candidates (
  node_id TEXT PRIMARY KEY,
  workflow_id TEXT NOT NULL,
  site_id TEXT NOT NULL,
  mac TEXT NOT NULL,
  uuid TEXT NOT NULL,
  seen_at BIGINT NOT NULL,
  created_at BIGINT NOT NULL,
  state TEXT NOT NULL,
  decided_by TEXT NOT NULL DEFAULT '',
  decided_at BIGINT NOT NULL DEFAULT 0
);
-- Acceptance flow: a discovery-mode ramdisk's self-asserted inventory, and the operator's decision.
ALTER TABLE discovered ADD COLUMN inventory TEXT NOT NULL DEFAULT '';
ALTER TABLE discovered ADD COLUMN acceptance TEXT NOT NULL DEFAULT '';
ALTER TABLE discovered ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
ALTER TABLE discovered ADD COLUMN decided_by TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE discovered DROP COLUMN decided_by;
ALTER TABLE discovered DROP COLUMN node_id;
ALTER TABLE discovered DROP COLUMN acceptance;
ALTER TABLE discovered DROP COLUMN inventory;
DROP TABLE mac_candidates;
