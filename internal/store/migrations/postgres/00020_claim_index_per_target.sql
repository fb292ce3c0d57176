-- +goose Up
-- A queued command is claimed either by its site's agents (runs_on 'site') or by its node's
-- ramdisk (runs_on 'ramdisk'), never both: each claim index now holds its own kind alone, so a
-- command enters and leaves one of them instead of two. An agent's active commands are looked
-- up by a non-empty agent only, so unassigned queued commands need no entry there.
DROP INDEX commands_claim;
CREATE INDEX commands_claim_site ON commands (site_id, target_agent, created_at) WHERE state = 'queued' AND runs_on = 'site';
DROP INDEX commands_node_queued;
CREATE INDEX commands_claim_ramdisk ON commands (node_id, generation, target_agent, created_at) WHERE state = 'queued' AND runs_on = 'ramdisk';
DROP INDEX commands_agent_active;
CREATE INDEX commands_agent_active ON commands (target_agent) WHERE target_agent <> '' AND state IN ('queued', 'delivered', 'running');

-- +goose Down
DROP INDEX commands_agent_active;
CREATE INDEX commands_agent_active ON commands (target_agent) WHERE state IN ('queued', 'delivered', 'running');
DROP INDEX commands_claim_ramdisk;
CREATE INDEX commands_node_queued ON commands (node_id, generation, target_agent, created_at) WHERE state = 'queued';
DROP INDEX commands_claim_site;
CREATE INDEX commands_claim ON commands (runs_on, site_id, target_agent, created_at) WHERE state = 'queued';
