-- Canary policies (module `policy::canary`): a candidate `[limits]` every instance runs beside
-- the live one without enforcing it. The newest row not discarded is the one in force; every
-- instance reads it each second. Ids are ULIDs; times Unix ms.
CREATE TABLE policy_candidates (
    id            TEXT PRIMARY KEY,
    policy        TEXT NOT NULL,
    reason        TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    created_by    TEXT NOT NULL,
    discarded_at  BIGINT,
    discarded_by  TEXT
);
