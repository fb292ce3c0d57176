-- +goose Up
-- A workflow's steps and cleanup (its plan: the profile's as the workflow began) are kept once
-- for every workflow of the same plan, keyed by their SHA-256 (Tx.InsertWorkflow), instead of
-- in every workflow's row: about 1 KiB of a 1.4 KiB row, rewritten with each step's update.
-- Each workflow from before keeps its own, under its id: one pass over the table, without
-- sorting every workflow's steps to find those alike (history retention deletes them with
-- their workflows). used_at is when a workflow last began on the plan: retention deletes a plan
-- no workflow names only when it is older than that (Tx.PurgeHistory, workflow_plans_used).
CREATE TABLE workflow_plans (
  digest TEXT PRIMARY KEY,
  steps TEXT NOT NULL,
  cleanup TEXT NOT NULL,
  used_at BIGINT NOT NULL
);
ALTER TABLE workflows ADD COLUMN plan TEXT NOT NULL DEFAULT '';
INSERT INTO workflow_plans (digest, steps, cleanup, used_at) SELECT id, steps, cleanup, created_at FROM workflows;
UPDATE workflows SET plan = id;
ALTER TABLE workflows DROP COLUMN steps;
ALTER TABLE workflows DROP COLUMN cleanup;
CREATE INDEX workflows_plan ON workflows (plan);
CREATE INDEX workflow_plans_used ON workflow_plans (used_at);

-- +goose Down
ALTER TABLE workflows ADD COLUMN steps TEXT NOT NULL DEFAULT '[]';
ALTER TABLE workflows ADD COLUMN cleanup TEXT NOT NULL DEFAULT '[]';
UPDATE workflows w SET steps = p.steps, cleanup = p.cleanup FROM workflow_plans p WHERE p.digest = w.plan;
DROP INDEX workflows_plan;
ALTER TABLE workflows DROP COLUMN plan;
DROP TABLE workflow_plans;
