-- +goose Up
CREATE TABLE join_tokens (
  hash BLOB PRIMARY KEY,
  kind TEXT NOT NULL,
  site_id TEXT NOT NULL DEFAULT '',
  node_id TEXT NOT NULL DEFAULT '',
  generation BIGINT NOT NULL DEFAULT 0,
  expires_at BIGINT NOT NULL,
  used_at BIGINT NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL
);
CREATE INDEX join_tokens_node ON join_tokens (node_id, kind);

-- +goose Down
DROP TABLE join_tokens;
