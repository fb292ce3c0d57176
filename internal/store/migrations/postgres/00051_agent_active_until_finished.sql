-- +goose Up
-- An agent's active commands are those assigned to it and not finished: finished_at is 0 while
-- a command is held, queued, delivered or running, and set when it ends (every path that ends
-- one sets it). Named by state, the index was taken out and put back by every acknowledgement
-- (queued → delivered sets the state), a delete and an insert of the same entry; by finished_at,
-- which only the command's end sets, an acknowledgement of an assigned command leaves it alone.
-- The queries that use it still name the three states (agentActiveCond).
DROP INDEX commands_agent_active;
CREATE INDEX commands_agent_active ON commands (target_agent) WHERE target_agent <> '' AND finished_at = 0;

-- +goose Down
DROP INDEX commands_agent_active;
CREATE INDEX commands_agent_active ON commands (target_agent) WHERE target_agent <> '' AND (state = 'queued' OR state = 'delivered' OR state = 'running');
