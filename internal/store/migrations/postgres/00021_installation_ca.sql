-- +goose Up
-- The agent CA belongs to the installation, not to one server: every replica sharing the store
-- signs and checks agent certificates with it. Its key is sealed with the installation's
-- sealing key (the only secret replicas must share); one row, id 1.
CREATE TABLE installation_ca (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  cert_pem TEXT NOT NULL,
  sealed_key BYTEA NOT NULL,
  created_at BIGINT NOT NULL
);

-- +goose Down
DROP TABLE installation_ca;
