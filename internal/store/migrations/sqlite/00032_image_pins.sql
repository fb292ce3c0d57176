-- +goose Up
-- The catalog image a deploy verb asked for, pinned: its digest ("sha256:HEX" or
-- "sha512:HEX") as the catalog held it when the verb was applied. The image write is refused
-- when the catalog's digest for the name changed since ('' : asked before pins existed).
ALTER TABLE nodes ADD COLUMN deploy_image_digest TEXT NOT NULL DEFAULT '';
-- The image (name and pinned digest) a batch's deploy writes, shown to its approvers.
ALTER TABLE batches ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE batches ADD COLUMN image_digest TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE batches DROP COLUMN image_digest;
ALTER TABLE batches DROP COLUMN image;
ALTER TABLE nodes DROP COLUMN deploy_image_digest;
