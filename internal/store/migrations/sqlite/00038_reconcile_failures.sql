-- +goose Up
-- A node's run of consecutive failed reconciliations, on its wake-up row (DESIGN §5: nothing
-- stays stuck without a fault): how many (the retry backs off from 5 s to 5 min with them), when
-- the first was, the last error (bounded), and when the run raised RECONCILE_FAILED (0: not yet).
-- A successful reconciliation deletes the row or resets them in the statement that ends its lease
-- (Tx.FinishWakeUp), so the usual path writes nothing more.
ALTER TABLE reconcile_queue ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE reconcile_queue ADD COLUMN failing_since BIGINT NOT NULL DEFAULT 0;
ALTER TABLE reconcile_queue ADD COLUMN last_error TEXT NOT NULL DEFAULT '';
ALTER TABLE reconcile_queue ADD COLUMN fault_raised_at BIGINT NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE reconcile_queue DROP COLUMN fault_raised_at;
ALTER TABLE reconcile_queue DROP COLUMN last_error;
ALTER TABLE reconcile_queue DROP COLUMN failing_since;
ALTER TABLE reconcile_queue DROP COLUMN failures;
