-- +goose Up
-- Most commands rows are finished history; the indexes that find work need only the unfinished
-- ones. Partial indexes hold those alone, so a command leaves each of them once instead of every
-- state change rewriting an entry in a tree the size of the whole history.
DROP INDEX commands_claim;
CREATE INDEX commands_claim ON commands (runs_on, site_id, target_agent, created_at) WHERE state = 'queued';
DROP INDEX commands_node_state;
CREATE INDEX commands_node_queued ON commands (node_id, generation, target_agent, created_at) WHERE state = 'queued';
DROP INDEX commands_agent_state;
CREATE INDEX commands_agent_active ON commands (target_agent) WHERE state IN ('queued', 'delivered', 'running');
DROP INDEX commands_batch;
CREATE INDEX commands_batch_held ON commands (batch_id) WHERE state = 'held';

-- +goose Down
DROP INDEX commands_batch_held;
CREATE INDEX commands_batch ON commands (batch_id, state);
DROP INDEX commands_agent_active;
CREATE INDEX commands_agent_state ON commands (target_agent, state);
DROP INDEX commands_node_queued;
CREATE INDEX commands_node_state ON commands (node_id, state);
DROP INDEX commands_claim;
CREATE INDEX commands_claim ON commands (runs_on, site_id, state, target_agent, created_at);
