-- +goose Up
-- Nothing on PostgreSQL: SQLite's 00052 keys its site claim index by age alone so that an
-- assignment leaves the entry in place. PostgreSQL writes a new entry in every index at such an
-- update anyway (the agent is in commands_agent_active's key: no heap-only update), so its index
-- keeps the agent in its key, which lets a claim find the free commands without reading rows.
SELECT 1;

-- +goose Down
SELECT 1;
