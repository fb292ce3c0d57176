-- +goose Up
CREATE TABLE signers (
  name TEXT PRIMARY KEY,
  public_key BYTEA NOT NULL,
  created_at BIGINT NOT NULL,
  revoked_at BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE images (
  name TEXT PRIMARY KEY,
  url TEXT NOT NULL,
  size BIGINT NOT NULL,
  format TEXT NOT NULL,
  compression TEXT NOT NULL,
  sha256 TEXT NOT NULL DEFAULT '',
  sha512 TEXT NOT NULL DEFAULT '',
  signer TEXT NOT NULL DEFAULT '',
  signature BYTEA,
  created_at BIGINT NOT NULL
);

-- +goose Down
DROP TABLE images;
DROP TABLE signers;
