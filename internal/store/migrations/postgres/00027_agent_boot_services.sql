-- +goose Up
-- What a site agent last reported of its boot services (bcd doctor): its DHCP mode and its boot
-- binding ("" before it reported them).
ALTER TABLE agents ADD COLUMN dhcp_mode TEXT NOT NULL DEFAULT '';
ALTER TABLE agents ADD COLUMN boot_binding TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE agents DROP COLUMN boot_binding;
ALTER TABLE agents DROP COLUMN dhcp_mode;
