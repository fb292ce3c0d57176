-- +goose Up
-- Claims read an agent's commands oldest first: with created_at in the index the read stops at
-- the claim's limit instead of sorting every queued command of the site.
DROP INDEX commands_claim;
CREATE INDEX commands_claim ON commands (runs_on, site_id, state, target_agent, created_at);

-- +goose Down
DROP INDEX commands_claim;
CREATE INDEX commands_claim ON commands (runs_on, site_id, state, target_agent);
