-- +goose Up
-- A site's queued commands by age alone, not by agent and age: a claim's assignment (which sets
-- the agent) then leaves the command's entry as it is, where it deleted it and inserted it again
-- under the agent (with 00051, the writer's busy time a machine 1-2 % lower in `bcd sim` at
-- 10 000 machines, alternated with the indexes before). A claim now reads past the commands
-- assigned and not yet acknowledged (its agents' last batches, at the front of the queue) to the
-- free ones, and the look for an agent's assigned commands (a new connection's first claim, then
-- at most once a second) reads the site's queue; both check the agent in the rows.
DROP INDEX commands_claim_site;
CREATE INDEX commands_claim_site ON commands (site_id, created_at) WHERE state = 'queued' AND runs_on = 'site';

-- +goose Down
DROP INDEX commands_claim_site;
CREATE INDEX commands_claim_site ON commands (site_id, target_agent, created_at) WHERE state = 'queued' AND runs_on = 'site';
