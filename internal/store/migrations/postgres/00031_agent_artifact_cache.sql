-- +goose Up
-- What a site agent last reported of its artifact cache (JSON: artifacts, bytes, bound,
-- evictions, evicted bytes; '' before it did), for bcd doctor.
ALTER TABLE agents ADD COLUMN artifact_cache TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE agents DROP COLUMN artifact_cache;
