-- +goose Up
-- The firmware mode a node boots in (uefi, legacy; '' leaves the driver's behaviour): the engine
-- puts it in every bmc.boot command of the node whose step names no mode.
ALTER TABLE nodes ADD COLUMN boot_mode TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE nodes DROP COLUMN boot_mode;
