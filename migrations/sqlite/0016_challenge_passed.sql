-- `challenge_passed`: the auth service reports that a person passed the step-up of a login
-- challenge; the context becomes known to the account. SQLite cannot change a CHECK in
-- place, so the table is rebuilt with the wider one (its rows, columns and indexes kept).
CREATE TABLE auth_events_new (
    event_id          TEXT PRIMARY KEY,
    kind              TEXT NOT NULL
                      CHECK (kind IN ('login_failure', 'login_success', 'challenge_passed')),
    account           TEXT NOT NULL,
    ip                TEXT NOT NULL,
    device_id         TEXT,
    endpoint          TEXT,
    ts                BIGINT NOT NULL,
    received_at       BIGINT NOT NULL,
    account_received  TEXT
);
INSERT INTO auth_events_new
    (event_id, kind, account, ip, device_id, endpoint, ts, received_at, account_received)
SELECT event_id, kind, account, ip, device_id, endpoint, ts, received_at, account_received
FROM auth_events;
DROP TABLE auth_events;
ALTER TABLE auth_events_new RENAME TO auth_events;
CREATE INDEX auth_events_ts_id ON auth_events (ts, event_id);
CREATE INDEX auth_events_account ON auth_events (account, ts);
