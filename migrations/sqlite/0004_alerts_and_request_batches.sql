-- Alerts (module `scoring::alerts`): anomalies, repeat offenders, spraying, lockouts. Ids are
-- ULIDs: `ORDER BY id DESC` is newest first and serves cursor pagination (GET /v1/alerts);
-- alerts_kind serves the kind filter, alerts_subject the subject filter.
CREATE TABLE alerts (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    subject     TEXT NOT NULL,
    message     TEXT NOT NULL,
    details     TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX alerts_kind ON alerts (kind, id);
CREATE INDEX alerts_subject ON alerts (subject, id);

-- The webhook outbox: one row per alert and webhook, written with the alert, so a delivery
-- is never lost and never blocks the request that raised it. alert_deliveries_due serves the
-- delivery loop (undelivered rows whose next attempt is due).
CREATE TABLE alert_deliveries (
    alert_id         TEXT NOT NULL REFERENCES alerts (id),
    webhook          TEXT NOT NULL,
    attempts         BIGINT NOT NULL,
    next_attempt_at  BIGINT NOT NULL,
    delivered_at     BIGINT,
    last_error       TEXT,
    PRIMARY KEY (alert_id, webhook)
);
CREATE INDEX alert_deliveries_due ON alert_deliveries (delivered_at, next_attempt_at);

-- Request telemetry batches as posted (POST /v1/events/requests): one row per batch, so a
-- 2xx means the batch is on disk; pruned after scoring.telemetry_retention_hours
-- (request_batches_received serves the pruning).
CREATE TABLE request_batches (
    id           TEXT PRIMARY KEY,
    received_at  BIGINT NOT NULL,
    events       BIGINT NOT NULL,
    body         TEXT NOT NULL
);
CREATE INDEX request_batches_received ON request_batches (received_at);
