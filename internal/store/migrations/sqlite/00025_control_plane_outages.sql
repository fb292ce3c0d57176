-- +goose Up
-- When the control plane (any server sharing the store) last recorded that it was alive
-- (microseconds; 0: never). A server's heartbeat that finds it older than the peer timeout
-- records an outage: no server was alive (or could write) in between, and the steps in progress
-- get that time back (their deadlines move by it).
CREATE TABLE control_plane (
  id INTEGER PRIMARY KEY,
  last_alive BIGINT NOT NULL DEFAULT 0
);
-- From the servers' last heartbeats, if one is recorded (a server that crashed, or was running
-- when the upgrade began): an upgrade that took long is then an outage too.
INSERT INTO control_plane (id, last_alive) SELECT 1, COALESCE(MAX(last_seen), 0) FROM servers;
-- The open workflows, which an outage's extension of deadlines reads without scanning every
-- workflow ever run.
CREATE INDEX workflows_open ON workflows (id) WHERE NOT outcome_applied;

-- +goose Down
DROP INDEX workflows_open;
DROP TABLE control_plane;
