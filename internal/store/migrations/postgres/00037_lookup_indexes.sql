-- +goose Up
-- A site agent's report of the machines it saw PXE-booting looks up, for each, the site's nodes
-- without MACs under the machine's product UUID (Tx.NodesWithoutMACs), in the writer: without
-- this index each lookup read every node of the site. Nodes change their product UUID once at
-- most (inspection), so the index costs their frequent updates nothing.
CREATE INDEX IF NOT EXISTS nodes_site_uuid ON nodes (site_id, product_uuid);
-- Every verified BMC credential rotation looks for superseded versions whose secret is still
-- stored (Tx.SupersededWithSecrets), in the writer: without this index each look read every
-- credential version ever made, and sorted them. Only versions still holding a secret are in it.
CREATE INDEX IF NOT EXISTS bmc_credential_versions_unpurged ON bmc_credential_versions (state, created_at) WHERE password_ref <> '';
-- A boot-lease holder's DHCP lease report removes, for each lease, the site's lease of the same
-- address under another MAC (Tx.PutDHCPLeases): without this index each removal read every lease
-- of the site, a report of n leases n times.
CREATE INDEX IF NOT EXISTS site_dhcp_leases_ip ON site_dhcp_leases (site_id, ip);

-- +goose Down
DROP INDEX IF EXISTS site_dhcp_leases_ip;
DROP INDEX IF EXISTS bmc_credential_versions_unpurged;
DROP INDEX IF EXISTS nodes_site_uuid;
