-- +goose Up
CREATE TABLE discovered (
  site_id TEXT NOT NULL,
  mac TEXT NOT NULL,
  uuid TEXT NOT NULL DEFAULT '',
  arch TEXT NOT NULL DEFAULT '',
  agent_id TEXT NOT NULL DEFAULT '',
  first_seen BIGINT NOT NULL,
  last_seen BIGINT NOT NULL,
  PRIMARY KEY (site_id, mac)
);
CREATE INDEX discovered_uuid ON discovered (uuid, last_seen);

-- +goose Down
DROP TABLE discovered;
