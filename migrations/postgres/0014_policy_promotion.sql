-- Promoted policies (module `policy::canary`): a canary promoted with one call becomes the
-- live `[limits]` of every instance (the newest promoted row not reverted is in force, read
-- each second and at start); a revert goes back to the settings file's. Times Unix ms.
ALTER TABLE policy_candidates ADD COLUMN promoted_at BIGINT;
ALTER TABLE policy_candidates ADD COLUMN promoted_by TEXT;
ALTER TABLE policy_candidates ADD COLUMN reverted_at BIGINT;
ALTER TABLE policy_candidates ADD COLUMN reverted_by TEXT;
