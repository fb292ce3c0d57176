-- +goose Up
-- The agent CAs a finished rotation retired (PEM certificates, oldest first; never their keys):
-- trusted for nothing live, kept so that attested results signed under them (wipe proofs)
-- still verify in an audit.
ALTER TABLE installation_ca ADD COLUMN retired_pem TEXT NOT NULL DEFAULT '';

-- +goose Down
ALTER TABLE installation_ca DROP COLUMN retired_pem;
