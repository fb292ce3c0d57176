-- +goose Up
-- A workflow's node never changes (as on SQLite, whose writer's cache relies on it).
-- +goose StatementBegin
CREATE FUNCTION workflows_node_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'a workflow''s node never changes';
END
$$;
-- +goose StatementEnd
CREATE TRIGGER workflows_node_fixed BEFORE UPDATE OF node_id ON workflows
  FOR EACH ROW WHEN (NEW.node_id IS DISTINCT FROM OLD.node_id) EXECUTE FUNCTION workflows_node_fixed();

-- +goose Down
DROP TRIGGER workflows_node_fixed ON workflows;
DROP FUNCTION workflows_node_fixed();
