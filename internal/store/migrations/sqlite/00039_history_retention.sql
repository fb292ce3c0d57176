-- +goose Up
-- History retention (Tx.PurgeHistory) finds the workflows that ended before the retention,
-- oldest first, without reading every workflow ever run. Only ended workflows are in it, and a
-- workflow ends once: it costs the hot path one index entry per workflow.
CREATE INDEX IF NOT EXISTS workflows_ended ON workflows (finished_at) WHERE outcome_applied;

-- +goose Down
DROP INDEX IF EXISTS workflows_ended;
