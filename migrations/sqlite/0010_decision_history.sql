-- The decision history (module `analyst::history`): refused and challenged limit checks,
-- the refusals of one key by one budget within `history.window_s` counted into one row,
-- with the explanation (scopes, multipliers and their reasons) as JSON. Ids are ULIDs
-- (newest first, cursor pagination); times are Unix ms. Pruned after
-- `history.retention_days` (decision_history_last).
CREATE TABLE decision_history (
    id           TEXT PRIMARY KEY,
    first_at     BIGINT NOT NULL,
    last_at      BIGINT NOT NULL,
    count        BIGINT NOT NULL,
    class        TEXT NOT NULL,
    outcome      TEXT NOT NULL,
    reason       TEXT NOT NULL,
    user_key     TEXT,
    ip           TEXT NOT NULL,
    device_key   TEXT,
    explanation  TEXT NOT NULL
);
CREATE INDEX decision_history_user ON decision_history (user_key, id);
CREATE INDEX decision_history_ip ON decision_history (ip, id);
CREATE INDEX decision_history_device ON decision_history (device_key, id);
CREATE INDEX decision_history_last ON decision_history (last_at);
