-- API tokens (module `access`). Only the SHA-256 of a token's secret is stored; requests
-- are authenticated by looking the hash up (unique index on token_hash). The partial unique
-- index keeps the names of active tokens unique, so a name identifies one live token.
-- Times are Unix milliseconds in both dialects.
CREATE TABLE access_tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('ingest', 'limiter', 'analyst', 'admin')),
    token_hash  TEXT NOT NULL UNIQUE,
    created_at  BIGINT NOT NULL,
    created_by  TEXT NOT NULL,
    revoked_at  BIGINT,
    revoked_by  TEXT
);
CREATE UNIQUE INDEX access_tokens_active_name ON access_tokens (name) WHERE revoked_at IS NULL;

-- Audit log (module `audit`): who did what, when. Ids are ULIDs, so `ORDER BY id DESC` is
-- newest first and the last id of a page is the cursor of the next (GET /v1/audit).
-- audit_log_action serves the `action` filter.
CREATE TABLE audit_log (
    id          TEXT PRIMARY KEY,
    at          BIGINT NOT NULL,
    actor_id    TEXT NOT NULL,
    actor_name  TEXT NOT NULL,
    actor_role  TEXT NOT NULL,
    action      TEXT NOT NULL,
    target      TEXT NOT NULL,
    details     TEXT NOT NULL,
    request_id  TEXT NOT NULL
);
CREATE INDEX audit_log_action ON audit_log (action, id);
