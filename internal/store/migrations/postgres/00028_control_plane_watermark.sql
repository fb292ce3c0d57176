-- +goose Up
-- What lets a server tell that the store it opens was restored from a backup (it is behind what
-- the server last saw in it): the store's own id, drawn once; how many heartbeats all servers
-- recorded in it; and how many times a restore was fenced (bcd store after-restore), after which
-- the servers' earlier records no longer count. And when a step of the database's clock was
-- last given back to the steps in progress (microseconds; PostgreSQL: every server sees the
-- step, one gives it back).
ALTER TABLE control_plane ADD COLUMN clock_step_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE control_plane ADD COLUMN store_id TEXT NOT NULL DEFAULT '';
ALTER TABLE control_plane ADD COLUMN beats BIGINT NOT NULL DEFAULT 0;
ALTER TABLE control_plane ADD COLUMN fences BIGINT NOT NULL DEFAULT 0;
UPDATE control_plane SET store_id = md5(random()::text || clock_timestamp()::text);

-- +goose Down
ALTER TABLE control_plane DROP COLUMN fences;
ALTER TABLE control_plane DROP COLUMN beats;
ALTER TABLE control_plane DROP COLUMN store_id;
ALTER TABLE control_plane DROP COLUMN clock_step_at;
