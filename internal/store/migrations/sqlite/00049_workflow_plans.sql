-- +goose Up
-- A workflow's steps and cleanup (its plan: the profile's as the workflow began) are kept once
-- for every workflow of the same plan, keyed by their SHA-256 (Tx.InsertWorkflow), instead of
-- in every workflow's row: about 1 KiB of a 1.4 KiB row, rewritten with each step's update.
-- A workflow's row names its plan (plan); one from before names none ('') and keeps its own
-- in steps and cleanup, which a new row leaves empty. So nothing is rewritten here: rewriting
-- every stored workflow held a copy of the table in memory (SQLite's statement journal, in its
-- temporary store) for as long as it took. used_at is when a workflow last began on the plan:
-- history retention deletes a plan no workflow names only when it is older than that
-- (Tx.PurgeHistory).
CREATE TABLE workflow_plans (
  digest TEXT PRIMARY KEY,
  steps TEXT NOT NULL,
  cleanup TEXT NOT NULL,
  used_at BIGINT NOT NULL
);
ALTER TABLE workflows ADD COLUMN plan TEXT NOT NULL DEFAULT '';
CREATE INDEX workflows_plan ON workflows (plan) WHERE plan <> '';
CREATE INDEX workflow_plans_used ON workflow_plans (used_at);

-- +goose Down
UPDATE workflows SET steps = (SELECT steps FROM workflow_plans p WHERE p.digest = workflows.plan),
  cleanup = (SELECT cleanup FROM workflow_plans p WHERE p.digest = workflows.plan)
  WHERE plan IN (SELECT digest FROM workflow_plans);
DROP INDEX workflows_plan;
ALTER TABLE workflows DROP COLUMN plan;
DROP TABLE workflow_plans;
