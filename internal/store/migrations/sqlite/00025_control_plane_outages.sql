-- +goose Up
-- When the control plane (any server sharing the store) last recorded that it was alive
-- (microseconds; 0: never). A server's heartbeat that finds it older than the peer timeout
-- records an outage: no server was alive (or could write) in between, and the steps in progress
-- get that time back (their deadlines move by it).
CREATE TABLE control_plane (
  id INTEGER PRIMARY KEY,
  last_alive BIGINT NOT NULL DEFAULT 0
);
INSERT INTO control_plane (id, last_alive) VALUES (1, 0);
-- The open workflows, which an outage's extension of deadlines reads without scanning every
-- workflow ever run.
CREATE INDEX workflows_open ON workflows (id) WHERE NOT outcome_applied;

-- +goose Down
DROP INDEX workflows_open;
DROP TABLE control_plane;
