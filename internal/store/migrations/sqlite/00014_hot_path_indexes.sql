-- +goose Up
-- No query reads commands by (state, site_id) (claims use commands_claim) or workflows by
-- (state, node_id) (open workflows are found by workflows_node_open): every command state
-- change and workflow transition paid for an index nothing used.
DROP INDEX commands_state;
DROP INDEX workflows_open;

-- +goose Down
CREATE INDEX workflows_open ON workflows (state, node_id);
CREATE INDEX commands_state ON commands (state, site_id);
