-- +goose Up
-- A pinned ISO's iPXE sanboot entry (bmc.media without virtual media) is a boot entry too, so
-- that a new boot-lease holder is given it (and caches and verifies the ISO): kind 'sanboot',
-- the ISO as JSON {name, url, sha256}.
ALTER TABLE boot_entries ADD COLUMN iso TEXT NOT NULL DEFAULT '';
-- +goose Down
ALTER TABLE boot_entries DROP COLUMN iso;
