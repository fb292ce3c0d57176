-- +goose Up
-- SQLite evaluates a partial index's condition on the old and the new row of every UPDATE that
-- sets a column it names, and codes `state IN (three values)` as a temporary table built anew
-- each time: every change of a command's state or agent built two. Three equalities are plain
-- comparisons (the queries that use the index repeat the condition, as SQLite requires).
DROP INDEX commands_agent_active;
CREATE INDEX commands_agent_active ON commands (target_agent) WHERE target_agent <> '' AND (state = 'queued' OR state = 'delivered' OR state = 'running');

-- +goose Down
DROP INDEX commands_agent_active;
CREATE INDEX commands_agent_active ON commands (target_agent) WHERE target_agent <> '' AND state IN ('queued', 'delivered', 'running');
