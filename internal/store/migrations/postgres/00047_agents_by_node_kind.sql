-- +goose Up
-- Every boot of a node's ramdisk or OS connects as an agent of its own, and the rows stay: the
-- queries that ask whether a node's agent of one kind and identity generation is up read, by
-- node alone, every agent the node ever had. By node, kind and generation they read the few
-- of the current boots.
DROP INDEX agents_node;
CREATE INDEX agents_node ON agents (node_id, kind, generation);

-- +goose Down
DROP INDEX agents_node;
CREATE INDEX agents_node ON agents (node_id);
