-- Scoring's stored factors (module `scoring`): the truth behind the factor hashes of the hot
-- store, written with them and read back when the hot store has lost its data. One row
-- per subject and factor id (`signal:code`); body is the factor as JSON; expires_at NULL
-- means until retracted (factors_expires serves the rebuild's filter and pruning).
CREATE TABLE factors (
    subject     TEXT NOT NULL,
    id          TEXT NOT NULL,
    body        TEXT NOT NULL,
    expires_at  BIGINT,
    PRIMARY KEY (subject, id)
);
CREATE INDEX factors_expires ON factors (expires_at);

-- A hot-store rebuild replays the auth events of the last window in (ts, event_id) order, a
-- page at a time; the index on ts alone made each page re-read every event of a busy
-- millisecond. The new index serves retention pruning as the old one did.
DROP INDEX auth_events_ts;
CREATE INDEX auth_events_ts_id ON auth_events (ts, event_id);
