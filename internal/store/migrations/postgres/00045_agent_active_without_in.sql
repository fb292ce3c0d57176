-- +goose Up
-- The same condition as SQLite's (whose IN list cost a temporary table on every update, see its
-- 00045): the queries that use the index name it in this form on both engines.
DROP INDEX commands_agent_active;
CREATE INDEX commands_agent_active ON commands (target_agent) WHERE target_agent <> '' AND (state = 'queued' OR state = 'delivered' OR state = 'running');

-- +goose Down
DROP INDEX commands_agent_active;
CREATE INDEX commands_agent_active ON commands (target_agent) WHERE target_agent <> '' AND state IN ('queued', 'delivered', 'running');
