-- +goose Up
-- A node's workflows are found through workflows_node_open (node, outcome applied, created):
-- its open workflow by all three, its listing by the node (one node's rows, sorted). A second
-- index by node and creation was one more b-tree insert at every workflow's start, on a leaf of
-- its own: ten thousand machines in flight share none.
DROP INDEX workflows_node;

-- +goose Down
CREATE INDEX workflows_node ON workflows (node_id, created_at);
