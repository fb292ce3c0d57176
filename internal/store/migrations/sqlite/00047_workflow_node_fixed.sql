-- +goose Up
-- A workflow's node never changes. SQLite's writer caches each node's open workflow and drops
-- it when a statement changes one of that node's workflows (see rowCache): a workflow moved to
-- another node would change which workflow is open for a node the change does not name.
-- +goose StatementBegin
CREATE TRIGGER workflows_node_fixed BEFORE UPDATE OF node_id ON workflows
WHEN NEW.node_id IS NOT OLD.node_id
BEGIN
  SELECT RAISE(ABORT, 'a workflow''s node never changes');
END;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER workflows_node_fixed;
