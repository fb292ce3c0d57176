-- +goose Up
-- Each agent connection names the server it is connected to, and each server records when it
-- was last alive: the connections of a server that stopped beating (killed, its host gone) end
-- with it, so their agents' commands are released or lost as for any departed agent, instead of
-- waiting forever on a connection nobody holds. '' is a connection recorded before this
-- migration: its server is unknown, and it is left as it is.
ALTER TABLE agents ADD COLUMN server_id TEXT NOT NULL DEFAULT '';
CREATE TABLE servers (
  id TEXT PRIMARY KEY,
  started_at BIGINT NOT NULL,
  last_seen BIGINT NOT NULL
);

-- +goose Down
DROP TABLE servers;
ALTER TABLE agents DROP COLUMN server_id;
