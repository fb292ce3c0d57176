-- +goose Up
-- The transaction that wrote each event: a follower reads events in commit order, by (xid, id),
-- up to the oldest transaction still running, so an event whose transaction took a lower id
-- but committed later than a higher one is not passed over (Store.EventsSince).
ALTER TABLE events ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX events_xid ON events (xid, id);

-- +goose Down
DROP INDEX events_xid;
ALTER TABLE events DROP COLUMN xid;
