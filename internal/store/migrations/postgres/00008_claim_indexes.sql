-- +goose Up
CREATE INDEX commands_node_state ON commands (node_id, state);
CREATE INDEX commands_agent_state ON commands (target_agent, state);
CREATE INDEX workflows_node_open ON workflows (node_id, outcome_applied, created_at);

-- +goose Down
DROP INDEX workflows_node_open;
DROP INDEX commands_agent_state;
DROP INDEX commands_node_state;
