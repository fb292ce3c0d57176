-- +goose Up
-- Fast track (seed 003 phase 0.9): after commissioning, release or inspection the node's ramdisk
-- lingers until linger_until (microseconds; 0: not lingering) so that a workflow started in the
-- window uses it without a boot; then the reconciler tells it to power its host off with the
-- command linger_command (empty until sent).
ALTER TABLE nodes ADD COLUMN linger_until BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN linger_command TEXT NOT NULL DEFAULT '';
-- +goose Down
ALTER TABLE nodes DROP COLUMN linger_command;
ALTER TABLE nodes DROP COLUMN linger_until;
