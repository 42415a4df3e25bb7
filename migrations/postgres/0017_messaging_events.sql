-- Delivery outcomes of one-time codes (`POST /v1/events/messaging`): each destination's
-- conversion (codes verified per code sent) is judged from them. The destination (a phone
-- number's country code and leading digits, or an e-mail domain) is kept, never the number.
CREATE TABLE messaging_events (
    event_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('otp_sent', 'otp_verified')),
    destination TEXT NOT NULL,
    ts BIGINT NOT NULL
);
CREATE INDEX messaging_events_ts ON messaging_events (ts);
