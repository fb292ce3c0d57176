-- +goose Up
-- History retention (Tx.PurgeHistory) finds the finished commands of no workflow, oldest first:
-- those run without one, and those an ended workflow left because a row named them when it was
-- deleted. Commands of a workflow, nearly all of them, are not in it.
CREATE INDEX IF NOT EXISTS commands_loose ON commands (finished_at) WHERE workflow_id = '' AND finished_at > 0;

-- +goose Down
DROP INDEX IF EXISTS commands_loose;
