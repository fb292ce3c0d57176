-- +goose Up
-- PostgreSQL records each event's transaction for followers (Store.EventsSince). SQLite's one
-- writer gives ids in commit order already: nothing to add.
SELECT 1;

-- +goose Down
SELECT 1;
