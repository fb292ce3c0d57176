-- +goose Up
-- A command's rows in the indexes named by node (node_id, created_at) and by workflow
-- (workflow_id) were two b-tree entries for every command inserted, each on a leaf of its own
-- (keyed by a node or workflow among thousands running at once): one index serves both, since a
-- workflow's commands are its node's. Queries by workflow name the node too; the kind is in the
-- key for the queries that read one kind of a node's or workflow's commands.
DROP INDEX commands_workflow;
DROP INDEX commands_node;
CREATE INDEX commands_node ON commands (node_id, workflow_id, kind, created_at);

-- +goose Down
DROP INDEX commands_node;
CREATE INDEX commands_node ON commands (node_id, created_at);
CREATE INDEX commands_workflow ON commands (workflow_id);
