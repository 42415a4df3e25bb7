-- The traffic record (module `policy::record`): limit-check inputs for `palisade replay`,
-- written each second when `record.enabled`. Users and devices are keyed pseudonyms and the
-- client a synthetic IPv6 address standing for its address (IPv4) or prefix (IPv6); ids are
-- ULIDs, so (at, id) is the order checks were decided in. consume is 1 or 0. Pruned after
-- `record.retention_hours` (traffic_record_at).
CREATE TABLE traffic_record (
    id        TEXT PRIMARY KEY,
    at        BIGINT NOT NULL,
    method    TEXT NOT NULL,
    endpoint  TEXT NOT NULL,
    ip        TEXT NOT NULL,
    user_key  TEXT,
    device_key TEXT,
    cost      BIGINT NOT NULL,
    consume   BIGINT NOT NULL
);
CREATE INDEX traffic_record_at ON traffic_record (at, id);
