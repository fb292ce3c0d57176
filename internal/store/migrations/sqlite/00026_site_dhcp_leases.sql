-- +goose Up
-- The full-mode DHCP leases of each site, as its boot-lease holders reported them, so that a
-- new holder starts its DHCP knowing the addresses in use (expires_at in microseconds).
CREATE TABLE site_dhcp_leases (
  site_id TEXT NOT NULL,
  mac TEXT NOT NULL,
  ip TEXT NOT NULL,
  expires_at BIGINT NOT NULL,
  PRIMARY KEY (site_id, mac)
);

-- +goose Down
DROP TABLE site_dhcp_leases;
