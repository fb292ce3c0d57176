-- +goose Up
CREATE TABLE deploy_profiles (
  name TEXT PRIMARY KEY,
  definition TEXT NOT NULL,
  updated_at BIGINT NOT NULL
);

-- +goose Down
DROP TABLE deploy_profiles;
