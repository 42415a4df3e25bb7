-- Manual allow/deny entries (module `reputation::lists`), managed by analysts. Deleted and
-- expired entries are kept for the audit trail; list_entries_live serves loading the live set
-- on every instance (on start and whenever the hot-store version counter changes).
CREATE TABLE list_entries (
    id          TEXT PRIMARY KEY,
    list        TEXT NOT NULL CHECK (list IN ('allow', 'deny')),
    kind        TEXT NOT NULL CHECK (kind IN ('cidr', 'asn', 'account', 'device')),
    value       TEXT NOT NULL,
    reason      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    created_by  TEXT NOT NULL,
    expires_at  BIGINT,
    deleted_at  BIGINT,
    deleted_by  TEXT
);
CREATE INDEX list_entries_live ON list_entries (list, deleted_at);
