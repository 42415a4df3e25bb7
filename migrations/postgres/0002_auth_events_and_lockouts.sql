-- Auth events posted by the auth service (module `ingest`). event_id is the idempotency key:
-- a retried batch inserts nothing twice (INSERT … ON CONFLICT DO NOTHING). auth_events_ts
-- serves retention pruning; auth_events_account serves a lockout's event list.
CREATE TABLE auth_events (
    event_id     TEXT PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN ('login_failure', 'login_success')),
    account      TEXT NOT NULL,
    ip           TEXT NOT NULL,
    device_id    TEXT,
    endpoint     TEXT,
    ts           BIGINT NOT NULL,
    received_at  BIGINT NOT NULL
);
CREATE INDEX auth_events_ts ON auth_events (ts);
CREATE INDEX auth_events_account ON auth_events (account, ts);

-- Lockouts (module `lockout`). Ids are ULIDs: `ORDER BY id DESC` is newest first and serves
-- cursor pagination (GET /v1/lockouts); lockouts_account serves the account filter and the
-- escalation level (previous lockouts within the decay period).
CREATE TABLE lockouts (
    id              TEXT PRIMARY KEY,
    account         TEXT NOT NULL,
    scope           TEXT NOT NULL,
    reason          TEXT NOT NULL,
    failures        BIGINT NOT NULL,
    level           BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    locked_until    BIGINT NOT NULL,
    released_at     BIGINT,
    released_by     TEXT,
    release_reason  TEXT
);
CREATE INDEX lockouts_account ON lockouts (account, id);

-- The failure events that caused a lockout (GET /v1/lockouts/{id}).
CREATE TABLE lockout_events (
    lockout_id  TEXT NOT NULL REFERENCES lockouts (id),
    event_id    TEXT NOT NULL,
    PRIMARY KEY (lockout_id, event_id)
);
